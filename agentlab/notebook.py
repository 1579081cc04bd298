"""One call at the top of every notebook, so its committed outputs read the same on any machine and code host.

    from agentlab.api import setup_notebook
    setup_notebook()

What it quiets, and why: transformers' and TRL's deprecation notices (``FutureWarning``) and TRL's
experimental-feature warning say nothing about the lesson and carry the maker's absolute site-packages paths;
the progress bars of transformers' weight loading and of datasets' ``map``/``filter`` are widgets that a code host
shows as "0%| | 0/272". Our own progress (episodes, training steps) still prints, and every path we print is
relative to the repository (:func:`agentlab.paths.shown`). Warnings raised by agentlab itself are never hidden.
"""

from __future__ import annotations

import os
import random
import warnings

QUIET_ENV = {
    "TRANSFORMERS_VERBOSITY": "error",           # transformers' info/warning logs
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",    # datasets' map/filter bars (SFTTrainer's tokenising)
    "TOKENIZERS_PARALLELISM": "false",           # the fork warning of tokenizers
    "TRL_EXPERIMENTAL_SILENCE": "1",             # TRL's own switch for its experimental-feature notices
}
QUIET_WARNINGS = (  # (category, module regex, message regex): only the libraries' notices, never ours
    (FutureWarning, r"(transformers|trl|torch|peft|accelerate)(\.|$)", ""),
    (DeprecationWarning, r"(transformers|trl|torch|peft|accelerate)(\.|$)", ""),
    (UserWarning, r"trl(\.|$)", r"(?i).*experimental"),
)


def setup_notebook(seed: int | None = 0) -> None:
    """Quiet the libraries' notices and bars (see the module docstring) and seed Python's and numpy's generators
    (``None``: leave them). Safe to call again."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    for category, module, message in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        pass
    else:
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()  # "Loading weights: 0/272"
    if seed is not None:
        import numpy as np

        random.seed(seed)
        np.random.seed(seed)
