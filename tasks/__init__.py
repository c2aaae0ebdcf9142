"""timbench.tasks: seeded synthetic math tasks with verifiers, plus loaders for
real math datasets (GSM8K, MATH, DAPO-Math) the user has on disk.

Importing the package registers every synthetic task; `get_task(name)` returns
one, `list_tasks()` summarises them. The default task is `add-4d-v1`.
"""

# Imported for their @register side effect.
from . import addchain, addition, countdown, lineq, multiplication  # noqa: E402,F401
from .base import Problem, Task, split_of
from .io import load_split, problems_from_dataset, save_split, to_dataset
from .registry import DEFAULT_TASK, UnknownTaskError, get_task, list_tasks, register, task_names

__all__ = [
    "DEFAULT_TASK",
    "Problem",
    "Task",
    "UnknownTaskError",
    "get_task",
    "list_tasks",
    "load_split",
    "problems_from_dataset",
    "register",
    "save_split",
    "split_of",
    "task_names",
    "to_dataset",
]
