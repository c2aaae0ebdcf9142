"""The one registry type (timbench.util.registry): lookup with aliases, one error wording with a did-you-mean,
registration, and the tables ported onto it answering a typo the same way."""

import pytest

from timbench.util.registry import Registry, did_you_mean

pytestmark = pytest.mark.unit  # builds no model (make test-unit)


class Oops(KeyError):
    def __str__(self):
        return str(self.args[0])


def test_lookup_resolves_names_and_aliases():
    r = Registry("colour", {"red": 1, "green": 2}, aliases={"rouge": "red"})
    assert r.lookup("red") == 1 and r.lookup("rouge") == 1 and r.names() == ["red", "green", "rouge"]
    assert dict(r) == {"red": 1, "green": 2} and "red" in r and len(r) == 2 and ", ".join(r) == "red, green"


def test_unknown_name_is_one_line_with_did_you_mean_and_the_valid_names():
    r = Registry("colour", {"red": 1, "green": 2})
    with pytest.raises(ValueError) as e:
        r.lookup("gren")
    assert str(e.value) == "unknown colour 'gren'; did you mean 'green'? valid: red, green"
    with pytest.raises(ValueError, match=r"^unknown colour 'zzz'; valid: red, green$"):
        r.lookup("zzz")  # nothing close: no guess
    with pytest.raises(ValueError, match=r"^spec: unknown colour \['red'\]; valid: red, green$"):
        r.lookup(["red"], "spec")  # unhashable (a YAML list): the same one line, not a TypeError


def test_error_type_label_suffix_and_sorting_are_the_tables_own():
    r = Registry(
        "task", {"b-1": 1, "a-1": 2}, error=Oops, valid_label="valid names", sort=True, valid_suffix=" or a path"
    )
    with pytest.raises(Oops) as e:
        r.lookup("a-2")
    assert str(e.value) == "unknown task 'a-2'; did you mean 'a-1'? valid names: a-1, b-1 or a path"


def test_register_as_decorator_and_twice_is_an_error():
    r = Registry("thing")

    @r.register("x")
    class X:
        pass

    assert r.lookup("x") is X and r.register("x", X) is X  # the same value again is fine

    class Y:
        pass

    with pytest.raises(ValueError, match=r"^thing name 'x' registered twice \(X, Y\)$"):
        r.register("x", Y)


def test_did_you_mean_needs_a_close_string():
    assert did_you_mean("tis_tokn", ["tis_token", "icepop"]) == "did you mean 'tis_token'? "
    assert did_you_mean("qqq", ["tis_token"]) == "" and did_you_mean(3, ["3"]) == ""


def test_the_ported_tables_share_the_wording():
    from timbench.grid.endpoint import check_endpoint
    from timbench.kernels import get_kernels
    from timbench.model.config import preset
    from timbench.rl.algorithms import get_algorithm, kl_penalty
    from timbench.runners import get_backend

    with pytest.raises(ValueError, match=r"^unknown kernel set 'exct'; did you mean 'exact'\? valid: exact, torch$"):
        get_kernels("exct")
    with pytest.raises(ValueError, match=r"^unknown algorithm 'grp'; did you mean 'grpo'\? valid: grpo, "):
        get_algorithm("grp")
    with pytest.raises(ValueError, match=r"^unknown KL estimator 'low_var'; did you mean 'low_var_kl'\? valid: k1,"):
        kl_penalty(None, None, "low_var")
    with pytest.raises(
        ValueError,
        match=r"^unknown model preset 'tiny-dens'; did you mean 'tiny-dense'\? valid: .* or a checkpoint path$",
    ):
        preset("tiny-dens")
    with pytest.raises(ValueError, match=r"^endpoint: unknown endpoint 'last'; did you mean 'last3'\? valid: final,"):
        check_endpoint("last")
    with pytest.raises(ValueError, match=r"^unknown backend 'rey'; did you mean 'ray'\? valid: local, ray$"):
        get_backend("rey")
