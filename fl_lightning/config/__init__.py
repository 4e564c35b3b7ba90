"""Configuration: everything that declares, reads, checks or explains a key. Torch-free (the command line checks a
run's config before torch loads). The rest of the package imports only the names below.

- :mod:`.schema`: the typed schema of the fixed groups (``fl``, ``trainer``, ``data``, ``checkpoint``, ...), each
  key's default, range, help and whether it changes results; registered with Hydra (:func:`register`).
- :mod:`.ranges`: the range vocabulary (``Annotated[float, Range(0, 1)]``, ``OneOf``, a named ``Validate``) a schema
  field and a constructor argument state alike, read by one function (:func:`.ranges.hint_meta`).
- :mod:`.run_check`: :func:`check_run`, the one check of a run's config (schema, paper block, targets).
- :mod:`.hashing`: :func:`config_hash` and :func:`result_diff`, what a resumed run must share with its checkpoint.
- :mod:`.checks`: the schema's check of a composed config and of command-line overrides, one line per bad key.
- :mod:`.groups` and :mod:`.args`: the ``_target_`` groups (methods' parts, models, datasets) checked against the
  targets' signatures and their arguments' ranges, before anything is built.
- :mod:`.compose`: :func:`instantiate`, which builds a ``_target_`` node and names the full key of any error.
- :mod:`.paper_block`: a run's ``paper:`` block, read and checked.
- :mod:`.budget`: :class:`StepBudget`, a client's local work (``fl.local_steps`` or ``fl.local_epochs``) as a value.
- :mod:`.keys`: ``python -m fl_lightning.config.keys``, the keys of a group or a chosen config, explained.
"""
from __future__ import annotations

from .args import check_call, check_targets, target_info
from .budget import StepBudget
from .checks import check, check_clients, check_overrides, check_resume, check_value, closest_key, example, rules, value_text
from .hashing import config_hash, result_diff
from .run_check import check_run
from .compose import blame, instantiate, interpolation_source, qualify, root_of
from .groups import check_parts
from .paper_block import UNITS, Paper, PaperError, read_paper
from .ranges import Betas, Fraction, LearningRate, NonNegative, OneOf, Positive, Range, Validate
from .schema import (CONFIG_GROUPS, FEDERATION_KEYS, OPTIONAL_GROUPS, FL, Checkpoint, all_keys, data_defaults,
                     hash_rules, not_result_keys, not_setting_keys, register)

__all__ = [
    "Betas", "blame", "check", "check_call", "check_clients", "check_run", "config_hash", "FEDERATION_KEYS",
    "result_diff", "check_overrides", "check_parts", "check_resume", "check_targets",
    "check_value", "Checkpoint", "closest_key", "CONFIG_GROUPS", "data_defaults", "FL", "Fraction", "hash_rules",
    "instantiate", "interpolation_source", "LearningRate", "NonNegative", "not_result_keys", "not_setting_keys",
    "OneOf", "OPTIONAL_GROUPS", "Paper", "PaperError", "Positive", "qualify", "Range", "read_paper", "register",
    "root_of", "rules", "StepBudget", "target_info", "UNITS", "Validate", "all_keys", "example", "value_text",
]
