"""Shakespeare (LEAF, Caldas et al. 2018, arXiv 1812.01097): next-character prediction, one client per speaking
role, as seed 002 uses it (FedSMU, Sec. 5.1: "the same train/test splits as in (Acar et al., 2021)", i.e. FedDyn's
``ShakespeareObjectCrop_noniid``, Acar et al., ICLR 2021, whose details below are FedDyn's code, not FedSMU's).

Files (nothing is downloaded): LEAF's ``data/shakespeare/data/train/*.json`` and ``test/*.json`` (``preprocess.sh
-s niid --sf 1.0 -k 0 -t sample``), put in ``root/train`` and ``root/test``: ``{"users": [...], "user_data":
{role: {"x": [80-character strings], "y": [next characters]}}}``. Characters are LEAF's 80-letter alphabet
(``ALL_LETTERS``; any other character, which LEAF's ``find`` would make -1, becomes a space).

Selection (FedDyn's code, as above): the roles with more than ``train_per_client`` (2000) training and more than
``test_per_client`` (400) test samples, shuffled with ``np.random.RandomState(selection_seed)``; the first ``roles``
are the clients (``roles: ${fl.num_clients}``; ``auto``: every eligible role). Client c keeps ``train_per_client``
contiguous training samples and ``test_per_client`` contiguous test samples, each window starting at
``RandomState(selection_seed + c).randint(len - count)``; the test samples of all clients are pooled into one test
set. The ``group`` tensor (the role) feeds ``data/partition=natural`` (client = role).
"""
from __future__ import annotations

import glob
import json
import os
from typing import Annotated

import numpy as np
import torch

from ..errors import ConfigError
from ..config import Range
from .info import DataInfo
from .pydoc_chars import encode
from .tensors import TensorSet

ALL_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"


def read_leaf(folder: str) -> tuple[list[str], dict[str, dict]]:
    """(roles in file order, ``user_data``) merged over the LEAF json files of ``folder``."""
    files = sorted(glob.glob(os.path.join(folder, "*.json")))
    if not files:
        split = os.path.basename(folder)
        raise ConfigError("root", f"no LEAF json file in {folder}", f"put the json files of LEAF's data/shakespeare/data/"
                          f"{split} (preprocess.sh -s niid --sf 1.0 -k 0 -t sample) in {folder}, or set data.root")
    users, data = [], {}
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                part = json.load(f)
            found = _leaf_users(part)
        except (OSError, ValueError, KeyError, TypeError) as err:  # JSONDecodeError and UnicodeDecodeError included
            what = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
            raise ConfigError("root", f"{path} is not a LEAF json file ({type(err).__name__}: {what})",
                              "replace it with LEAF's file (preprocess.sh -s niid --sf 1.0 -k 0 -t sample writes "
                              "{\"users\": [...], \"user_data\": {user: {\"x\": [...], \"y\": [...]}}}), "
                              "or point data.root at another folder") from None
        users += [u for u in found if u not in data]
        data.update({u: part["user_data"][u] for u in found})
    return users, data


def _leaf_users(part) -> list[str]:
    """The users of one LEAF file, after checking its shape: ``users`` (a list), ``user_data[user]`` with ``x`` and
    ``y`` lists of strings of equal length."""
    if not isinstance(part, dict) or not isinstance(part.get("users"), list) or \
            not isinstance(part.get("user_data"), dict):
        raise ValueError('expected an object with "users" (a list) and "user_data" (an object)')
    for u in part["users"]:
        d = part["user_data"].get(u) if isinstance(u, str) else None
        if not isinstance(d, dict):
            raise KeyError(f"user {u!r} of \"users\" has no user_data")
        x, y = d.get("x"), d.get("y")
        if not (isinstance(x, list) and isinstance(y, list) and len(x) == len(y)):
            raise ValueError(f"user {u!r}: \"x\" and \"y\" must be lists of equal length")
        if not all(isinstance(v, str) for v in x) or not all(isinstance(v, str) for v in y):
            raise ValueError(f"user {u!r}: \"x\" and \"y\" must hold strings")
    return part["users"]


def to_ids(strings: list[str]) -> np.ndarray:
    """LEAF's alphabet indices of equally long strings, as uint8 (len(strings), len)."""
    ids = encode("".join(strings), ALL_LETTERS)
    ids[ids == len(ALL_LETTERS)] = ALL_LETTERS.index(" ")
    return ids.reshape(len(strings), -1)


def crop(samples: dict, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    start = np.random.RandomState(seed).randint(len(samples["y"]) - count)
    return to_ids(samples["x"][start:start + count]), to_ids(samples["y"][start:start + count]).ravel().astype(np.int64)


def shakespeare(root: str = "data/shakespeare",
                roles: Annotated[int | str, Range(1, 1 << 20, words=("auto",))] = "auto",
                train_per_client: Annotated[int, Range(1, 1 << 24)] = 2000,
                test_per_client: Annotated[int, Range(1, 1 << 24)] = 400,
                selection_seed: Annotated[int, Range(0, 2**32 - 1)] = 0) -> tuple[TensorSet, TensorSet, DataInfo]:
    """(train, test, info): ``{"input_ids": uint8 (N, 80), "y", "group"}`` (see the module docstring)."""
    root = os.path.expanduser(str(root))
    users, train = read_leaf(os.path.join(root, "train"))
    _, test = read_leaf(os.path.join(root, "test"))
    tr_n, te_n = int(train_per_client), int(test_per_client)
    eligible = [u for u in users if len(train[u]["y"]) > tr_n and len(test.get(u, {"y": ()})["y"]) > te_n]
    np.random.RandomState(int(selection_seed)).shuffle(eligible)
    want = len(eligible) if str(roles) == "auto" else int(roles)
    if not eligible or want > len(eligible):
        raise ConfigError("roles", f"{want} roles asked for but {len(eligible)} of {len(users)} have > {tr_n} training "
                          f"and > {te_n} test samples", "lower fl.num_clients (or data.roles), or "
                          "data.train_per_client / data.test_per_client")
    sets = {"x": [], "y": [], "group": [], "tx": [], "ty": []}
    for c, u in enumerate(eligible[:want]):
        x, y = crop(train[u], tr_n, int(selection_seed) + c)
        sets["x"].append(x), sets["y"].append(y), sets["group"].append(np.full(len(y), c))
        x, y = crop(test[u], te_n, int(selection_seed) + c)
        sets["tx"].append(x), sets["ty"].append(y)
    cat = {k: torch.from_numpy(np.concatenate(v)) for k, v in sets.items()}
    width = cat["x"].shape[1]
    info = DataInfo(input_shape=(width,), num_classes=len(ALL_LETTERS), vocab_size=len(ALL_LETTERS), metrics=("acc",),
                    provenance={"data_roles": ",".join(eligible[:want])})
    return (TensorSet({"input_ids": cat["x"], "y": cat["y"], "group": cat["group"]}),
            TensorSet({"input_ids": cat["tx"], "y": cat["ty"]}), info)
