"""What every task door shares: user errors as exit code 2, and task options generated from the job model."""

from __future__ import annotations

import copy
import functools
import inspect

import invoke
from invoke import Exit

from training.spec import by_key
from trainkit.errors import JobFailed, SpecError


def user_errors(function):
    """Invalid input ends the task with its message and exit code 2 (no traceback); a job that failed ends it with
    its one-line cause and the job's exit code."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except SpecError as error:
            raise Exit(f"error: {error}", code=2) from None
        except JobFailed as error:
            raise Exit(f"error: {error}", code=error.code) from None

    return wrapper


def required(value, flag: str, what: str):
    """A task's required value: an option, not a positional (Invoke gives a positional the next word, even
    `--help`, so `invoke TASK --help` would run the task on a folder called --help)."""
    if value is None:
        raise SpecError(f"{flag} is required: {what}")
    return value


HELP_WORDS = ("--help", "-h")


class Task(invoke.Task):
    """An Invoke task whose one-letter flags are given on purpose (`short`: {parameter: letter}), never made up."""

    def __init__(self, *args, short: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.short = short or {}

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict:
        opts = super().arg_opts(name, default, taken_names)
        if name in self.short:
            opts["names"].append(self.short[name])
        return opts


def task(*args, **kwargs):
    """Invoke's `@task`, bare or with arguments, without its automatic short flags: Invoke gives each option the
    first free letter of its name (invoke/tasks.py `Task.arg_opts`, auto_shortflags), which took `-h` from help for
    `--epochs` and `--hf-token-file` and made `-o` mean `--model`. Every option is its long name, `-h` is help, and
    a task names the few letters users expect itself (`short`: `logs -f`, as `tail -f` and `kubectl logs -f`)."""
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return invoke.task(auto_shortflags=False, klass=Task)(args[0])
    return invoke.task(*args, auto_shortflags=False, klass=Task, **kwargs)


def task_arguments(task) -> list:
    """A task's Invoke arguments, with their help. Read from a copy: Invoke's `Task.get_arguments` pops each help
    text off the task as it reads it (invoke/tasks.py, arg_opts), so a second reader of the task gets none."""
    return copy.deepcopy(task).get_arguments()


def task_help(task) -> str:
    """What `invoke TASK --help` prints, for a task whose positional word took the `--help` (see `required`)."""
    positional = " ".join(f"<{name}>" for name in task.positional)
    doc = inspect.cleandoc(task.__doc__ or "").replace("\n", "\n  ")
    lines = [f"Usage: invoke {task.name} [--options] {positional}".rstrip(), "", f"Docstring:\n  {doc}", ""]
    lines.append("Options:")
    for argument in task_arguments(task):
        flag = f"--{argument.name.replace('_', '-')}"
        lines.append(f"  {flag:<28} {argument.help or ''}".rstrip())
    return "\n".join(lines)


def job_options(function, names, extra: dict[str, object]):
    """Give a task one option per job field in `names` (name, help and kind from its declaration in
    training/spec/) plus `extra` (name -> default); the body receives them all as keywords."""
    params = [inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    helps = {}
    for spec in (by_key()[name] for name in names):
        default = False if spec.switch else None
        params.append(inspect.Parameter(spec.key, inspect.Parameter.KEYWORD_ONLY, default=default))
        helps[spec.flag[2:]] = spec.help
        if spec.alias:
            params.append(inspect.Parameter(spec.alias, inspect.Parameter.KEYWORD_ONLY, default=None))
            helps[spec.alias] = f"Alias of {spec.flag}."
    params += [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=v) for k, v in extra.items()]
    function.__signature__ = inspect.Signature(params)
    return function, helps


def job_flags(values: dict, names) -> dict:
    """The job fields among a task's keywords; switches off and unset options mean "not given"."""
    flags = {}
    for name in names:
        spec = by_key()[name]
        value = values.get(spec.key)
        if spec.alias and values.get(spec.alias) is not None:
            if value is not None:
                raise SpecError(f"--{spec.alias} is an alias of {spec.flag}; give one of them")
            value = values[spec.alias]
        flags[spec.key] = (value or None) if spec.switch else value  # a switch left off: not given
    return flags
