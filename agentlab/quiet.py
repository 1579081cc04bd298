"""The libraries' notices and loading bars off, ours untouched: the notebooks' setup (``agentlab.notebook``) and
every ``agentlab`` command (``agentlab.cli``) call :func:`quiet_libraries` first.

    from agentlab.quiet import quiet_libraries
    quiet_libraries()

Why: transformers', TRL's and torch's deprecation notices (``FutureWarning``) and TRL's experimental-feature
warning say nothing about the run and carry the maker's absolute site-packages paths, in a terminal and in a
notebook's committed outputs alike; datasets' ``map``/``filter`` bars (SFTTrainer's tokenising) print once per SFT
run and transformers' weight-loading bar once per model load. Our own progress (episodes, GRPO steps) still shows,
and a warning agentlab raises is never hidden. Below the command line and the notebooks' door so both can call it.
"""

from __future__ import annotations

import os
import sys
import warnings

LIBRARY_ENV = {
    "TRANSFORMERS_VERBOSITY": "error",           # transformers' info/warning logs
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",    # datasets' map/filter bars (SFTTrainer's tokenising)
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",         # transformers' weight-loading bars read this switch at import
    "TOKENIZERS_PARALLELISM": "false",           # the fork warning of tokenizers
    "TRL_EXPERIMENTAL_SILENCE": "1",             # TRL's own switch for its experimental-feature notices
}
LIBRARY_WARNINGS = (  # (category, module regex, message regex): only the libraries' notices, never ours
    (FutureWarning, r"(transformers|trl|torch|peft|accelerate)(\.|$)", ""),
    (DeprecationWarning, r"(transformers|trl|torch|peft|accelerate)(\.|$)", ""),
    (UserWarning, r"trl(\.|$)", r"(?i).*experimental"),
)


NOTEBOOK_ENV = "AGENTLAB_NOTEBOOK"  # set by agentlab.notebook.setup_notebook: the tutorial's kernels


def in_notebook() -> bool:
    """Whether ``agentlab.notebook.setup_notebook`` ran in this process (the tutorial's kernels): our bars then leave
    one line each (``rollout._progress``, ``progress.summarise_steps``, ``sft.run_sft``). Here, at the bottom layer,
    so that every layer can ask."""
    return os.environ.get(NOTEBOOK_ENV) == "1"


def quiet_libraries() -> None:
    """Set the libraries' switches (a value the user set is kept) and filter their notices. Cheap before
    transformers is imported (its switches are read at import); after, its logging is set directly. Safe to call
    again."""
    for key, value in LIBRARY_ENV.items():
        os.environ.setdefault(key, value)
    for category, module, message in LIBRARY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()  # "Loading weights: 0/272"
