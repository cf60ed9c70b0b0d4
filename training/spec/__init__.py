"""The job's option schema and spec.json: every option of a training job, declared once (issue 51 split it out of
one module, training/spec/, by concern).

Each option is a field of one section (run, model, data, optimisation: trained.py; parallelism, checkpointing,
elastic, placement: running.py; evaluation: evaluated.py; lora: adapted.py; tracking: tracked.py) with its type,
default, help text, allowed values and range in one place (options.py `option`). The launcher (trainkit) derives the
`invoke train` flags and their help from these declarations, fills in and checks the values (trainkit/job/: build,
derive, validate), and writes the job as `runs/<run-id>/spec.json` (schema.py); the training workers read that file
back into the same classes (`read_job`). run_folder.py is the rest of the contract between the two: the run folder's
files and environment. Nothing here imports torch or trainkit, so the training image and the launcher share it.

A field's flag is its name with '-' for '_' (`--keep-checkpoints`), except where `flag` says otherwise
(`model.name` is `--model`). `None` means "not given": the model recipe, the machine or the backend decides, and
spec.json records the value that was decided.
"""

from training.spec.adapted import *  # noqa: F403
from training.spec.evaluated import *  # noqa: F403
from training.spec.options import *  # noqa: F403
from training.spec.run_folder import *  # noqa: F403
from training.spec.running import *  # noqa: F403
from training.spec.schema import *  # noqa: F403
from training.spec.tracked import *  # noqa: F403
from training.spec.trained import *  # noqa: F403
