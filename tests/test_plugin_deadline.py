"""A plug-in remedy's hook that never returns fails its run in one line (a timeout inside a step, not a hung grid)."""

import os
import signal
import threading
import time

import pytest

from timbench.cli import main
from timbench.model import PRESETS, Qwen3ForCausalLM, save_checkpoint
from timbench.remedies.deadline import PluginTimeout, call_hook, deadline, is_third_party
from timbench.rl.rundir import read_status

HANGS = """from timbench.remedies import Remedy, finish

class Sleeps(Remedy):
    name = 'sleeps'
    doc = 'never returns from __call__'
    def __call__(self, batch):
        import time
        time.sleep(3600)

class Spins(Remedy):
    name = 'spins'
    doc = 'returns from __call__, then loops forever in update_keep'
    def __call__(self, batch):
        return finish(batch)
    def update_keep(self, log_ratio, mask):
        while True:
            pass
"""


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    save_checkpoint(Qwen3ForCausalLM(PRESETS["tiny-dense"], seed=2), d)
    return d


def _args(ckpt, out):
    return ["train", "--out", str(out), "--quiet"] + [
        a
        for o in (
            f"model={ckpt}",
            "steps=2",
            "prompts_per_step=4",
            "group_size=4",
            "mini_batches=2",
            "eval_every=2",
            "eval_n=16",
            "checkpoint_every=1",
        )
        for a in ("--set", o)
    ]


@pytest.mark.parametrize("cls,hook", [("Sleeps", "__call__"), ("Spins", "update_keep")])
def test_a_hung_plugin_hook_fails_the_run_in_one_line(ckpt, tmp_path, capsys, cls, hook):
    (tmp_path / "hangs.py").write_text(HANGS)
    out = tmp_path / "run"
    t0 = time.monotonic()
    rc = main(_args(ckpt, out) + ["--remedy", f"{tmp_path / 'hangs.py'}:{cls}", "--plugin-timeout", "0.5"])
    assert rc == 1
    assert time.monotonic() - t0 < 120  # not the hour the plug-in asked for
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"remedy {cls.lower()}: {hook} did not return within 0.5 s" in err[0] and "--plugin-timeout" in err[0]
    st = read_status(out)
    assert st["status"] == "failed" and "PluginTimeout" in st["error"]
    assert "Traceback" in (out / "error.txt").read_text()
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL and signal.getitimer(signal.ITIMER_REAL)[0] == 0


def test_a_negative_plugin_timeout_is_a_one_line_error(ckpt, tmp_path, capsys):
    assert main(_args(ckpt, tmp_path / "r") + ["--plugin-timeout", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--plugin-timeout must be >= 0 seconds" in err[0]
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


def test_deadline_restores_the_handler_and_leaves_built_ins_and_other_threads_alone():
    def mine(signum, frame):
        pass

    old = signal.signal(signal.SIGALRM, mine)
    try:
        with pytest.raises(PluginTimeout, match="slow did not return within 0.05 s"), deadline(0.05, "slow"):
            time.sleep(5)
        assert signal.getsignal(signal.SIGALRM) is mine and signal.getitimer(signal.ITIMER_REAL)[0] == 0
        with deadline(0.05, "fast"):  # returns in time: no error, and the timer is off afterwards
            pass
        assert signal.getitimer(signal.ITIMER_REAL)[0] == 0
        with deadline(0, "unlimited"):
            time.sleep(0.1)
        box = []
        th = threading.Thread(target=lambda: box.append(_sleep_under_deadline()))
        th.start()
        th.join()
        assert box == ["returned"]  # SIGALRM cannot target a thread: off the main thread the call is unbounded
    finally:
        signal.signal(signal.SIGALRM, old)

    from timbench.remedies import load_remedy

    builtin = load_remedy("tis_token", {})
    assert not is_third_party(builtin)
    assert call_hook(builtin, "update_keep", None, None, limit_s=1e-9) is None  # no timer for built-ins


def _sleep_under_deadline():
    with deadline(0.05, "in a thread"):
        time.sleep(0.2)
    return "returned"


def test_a_forked_child_arms_its_own_watchdog_process_not_its_parents():
    from timbench.remedies.watchdog import Watchdog

    w = Watchdog()
    w.arm(3600, "parent", {})
    parent_helper = w._proc
    r, wr = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its order must go to a helper of its own, watching the child
        try:
            w.arm(3600, "child", {})
            os.write(wr, str(w._proc.pid).encode())
            w.disarm()
        finally:
            os._exit(0)
    os.close(wr)
    child_helper = int(os.read(r, 64) or b"0")
    os.waitpid(pid, 0)
    assert child_helper and child_helper != parent_helper.pid and parent_helper.poll() is None
    w.disarm()
    parent_helper.stdin.close()
    assert parent_helper.wait(30) == 0  # end of file: it exits, having killed nobody
