"""One construction idiom: strategy parts, optimizers (conf/optimizer/) and their factories are built from `_target_`
configs by fl_lightning.config.compose.instantiate, and a bad value anywhere becomes one ConfigError naming the full key."""
from __future__ import annotations

import pytest
import torch

from fl_lightning.config import check_targets
from fl_lightning.errors import ConfigError
from fl_lightning.strategies import build_strategy
from fl_lightning.strategies.parts import LocalOptimizer
from tests.helpers.harness import FakeData, LossModule, MLP, build, method_config, mse, regression_batches, run


@pytest.mark.parametrize("method,override,key", [
    ("fedavg", "method.parts.aggregation.rule=foo", "method.parts.aggregation.rule"),
    ("fedavg", "method.parts.aggregation.weighting=foo", "method.parts.aggregation.weighting"),
    ("fedavg", "method.parts.local_optimizer.state=foo", "method.parts.local_optimizer.state"),
    ("fedmuon_bc", "method.init=ones", "method.init (via method.parts.correction.init)"),
    ("fedmuon", "method.alpha=1.0", "method.alpha (via method.parts.alignment.alpha)"),
    ("fedmuon", "method.parts.momentum.codec=topk", "method.parts.momentum.codec"),
    ("fedmuon_svd", "method.svd_frac=0", "method.svd_frac (via method.parts.momentum.codec.frac)"),
    ("fedmuon_svd", "method.svd_mode=top", "method.svd_mode (via method.parts.momentum.codec.mode)"),
    ("scaffold", "method.control=option3", "method.control (via method.parts.correction.control)"),
    ("fedmuon_avg", "method.order=backwards", "method.order (via method.parts.step_order.order)"),
    ("fedavg", "+method.parts.aggregation.bogus=1", "method.parts.aggregation.bogus"),
    ("fedadam", "method.server_lr=-1", "method.server_lr (via method.parts.aggregation.server_opt.lr)"),
    ("fedavg", "+method.parts.nosuch.x=1", "method.parts.nosuch"),  # a node without _target_: was an AttributeError
    ("fedprox", "+method.parts.proxx.mu=1", "method.parts.proxx"),
    ("fedavg", "+method.parts.nosuch._target_=torch.nn.Identity", "method.parts.nosuch._target_"),  # not a Part
])
def test_part_errors_name_the_full_key(method, override, key):
    """As a run meets them: the config check (ranges from the annotations), then the build (the constructors' own)."""
    cfg = method_config(method, [override])
    with pytest.raises(ConfigError) as err:
        check_targets(cfg, groups=("method",))
        build_strategy(cfg.method)
    assert err.value.key == key
    assert "\n" not in str(err.value) and "fix:" in str(err.value)


def test_a_node_without_target_under_parts_names_the_parts_and_the_closest():
    from fl_lightning.config.groups import check_parts

    cfg = method_config("fedavg", ["+method.parts.agregation.rule=mean"])
    with pytest.raises(ConfigError) as err:
        check_parts(cfg.method)  # what validate runs before anything is built
    assert err.value.key == "method.parts.agregation"
    assert "its parts: local_optimizer, aggregation" in err.value.problem
    assert err.value.fix.startswith("did you mean method.parts.aggregation?"), err.value.fix
    cfg = method_config("fedavg", ["+method.parts.nosuch.x=1"])
    with pytest.raises(ConfigError) as err:
        check_parts(cfg.method)
    assert "+method.parts.nosuch._target_=" in err.value.fix and "method.parts.local_optimizer." in err.value.fix
    check_parts(method_config("fedavg", ["method.parts.aggregation=null"]).method)  # switched off: fine


def test_a_label_that_disagrees_with_its_target_is_refused():
    """``data.partition.name=foo`` ran the Dirichlet partition labelled foo; a node whose ``_target_`` is the user's
    own may carry any label (docs/extending.md: ``model.net._target_=mymodels.x`` on the default model)."""
    from fl_lightning.config.groups import check_labels
    from tests.helpers.cli import make_cfg

    for overrides, key, fix in [
            (["data.partition.name=foo"], "data.partition.name", "data/partition=foo"),
            (["data.partition.name=iid"], "data.partition.name", "data/partition=iid"),
            (["model.name=mlp"], "model.name", "model=mlp"),
            (["data.name=mnist"], "data.name", "data=mnist"),
            (["model.net._target_=fl_lightning.models.cnn.mlp", "~model.net.channels"], "model.name",
             "model.name=mlp")]:
        with pytest.raises(ConfigError) as err:
            check_labels(make_cfg(overrides))
        assert err.value.key == key and fix in err.value.fix, (overrides, str(err.value))
    for overrides in (["model=cnn_fedsmu_128"], ["model=resnet18", "model.name=resnet18_gn"], ["data/partition=iid"],
                      ["model.net._target_=tests.helpers.parts.UpdateNorm"], ["model.name=cnn"]):
        check_labels(make_cfg(overrides))  # the member's own label, one of its target's, or the user's own target


def test_parts_receive_ready_factories():
    strategy = build(method_config("fedavg"))
    lo = strategy.optimizer_part()
    assert isinstance(lo, LocalOptimizer)
    opt = lo.factory([torch.nn.Parameter(torch.zeros(2))])
    assert type(opt) is torch.optim.SGD and opt.param_groups[0]["lr"] == 0.05


@pytest.mark.parametrize("optimizer,cls", [("sgd", torch.optim.SGD), ("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW)])
def test_optimizer_group_swaps_the_local_optimizer(optimizer, cls):
    """`python train.py method=fedavg optimizer=adamw`: the method keeps its lr, the optimizer group its class."""
    strategy = build(method_config("fedavg", [f"optimizer={optimizer}", "method.lr=0.01"]))
    opt = strategy.optimizer_part().factory([torch.nn.Parameter(torch.zeros(2))])
    assert type(opt) is cls and opt.param_groups[0]["lr"] == 0.01


def test_each_muon_method_uses_its_papers_muon():
    from fl_lightning.optim import Muon

    expect = {"local_muon": ("ema", False, "polar_express", "sgd"), "fedmuon_bc": ("ema", False, "polar_express", "sgd"),
              "fedmuon_avg": ("ema", False, "muon", "adamw"), "fedmuon": ("ema_beta", True, "muon", "adamw"),
              "local_muon_reset": ("ema_beta", True, "muon", "adamw")}
    for name, (style, nesterov, coeffs, aux) in expect.items():
        opt = build(method_config(name)).optimizer_part().factory([torch.nn.Parameter(torch.zeros(3, 3))])
        assert isinstance(opt, Muon)
        g = opt.param_groups[0]
        assert (g["momentum_style"], g["nesterov"], g["ns_coeffs"], g["aux"]) == (style, nesterov, coeffs, aux), name


def test_fedavg_with_muon_optimizer_runs(tmp_path):
    """A Muon optimizer config pulled into a method that has none of its knobs falls back to the paper's values."""
    cfg = method_config("fedavg", ["optimizer=muon_004"])
    loop = run(build(cfg), LossModule(MLP(), mse), FakeData(regression_batches(2), 2), tmp_path,
               num_clients=2, per_round=2, rounds=1, local_steps=1)
    assert loop.round == 1


def test_fedmuon_bc_needs_muon(tmp_path):
    cfg = method_config("fedmuon_bc", ["method.init=zero", "optimizer=sgd", "~method.parts.local_optimizer.param_groups"])
    with pytest.raises(ConfigError, match="Muon"):
        run(build(cfg), LossModule(MLP(), mse), FakeData(regression_batches(2), 2), tmp_path,
            num_clients=2, per_round=2, rounds=1, local_steps=1)


@pytest.mark.parametrize("override", ["method.lr=-1", "method.lr=abc", "method.lr=null"])
def test_bad_optimizer_values_fail_at_build_with_one_line(override):
    with pytest.raises(ConfigError) as err:
        build_strategy(method_config("fedavg", [override]).method)
    # the key the user typed, found by the optimizer's own message or by the kind of the argument's default
    assert err.value.key == "method.lr (via method.parts.local_optimizer.optimizer.lr)" and "\n" not in str(err.value)


def test_threads_setting(monkeypatch):
    """trainer.threads: a number is applied; auto is the CPUs this process may use / trainer.devices (unless
    OMP_NUM_THREADS is set); anything else is one line naming the key, from the config's one check (build applies
    a checked value and does not check it again)."""
    import os

    from fl_lightning.run.build import apply_threads
    from fl_lightning.config import check
    from tests.helpers.cli import make_cfg

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    try:
        assert apply_threads(make_cfg(["trainer.threads=1"])) == 1 and torch.get_num_threads() == 1
        cpus = len(os.sched_getaffinity(0))
        assert apply_threads(make_cfg(["trainer.devices=2"])) == max(1, cpus // 2)
        for bad in ("0", "-1", "abc", "1.5"):
            with pytest.raises(ConfigError, match="trainer.threads"):
                check(make_cfg([f"trainer.threads={bad}"]))
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
def test_train_py_makes_idle_openmp_threads_sleep_before_torch_loads():
    """Spinning OpenMP threads collapsed the default run on a busy machine (docs/benchmarks.md): train.py sets
    OMP_WAIT_POLICY=PASSIVE before torch loads libgomp, and leaves a policy the user chose alone."""
    import os
    import subprocess
    import sys

    from tests.helpers.cli import ROOT

    code = ("import sys, os; import fl_lightning.threads as t; "
            "print(os.environ.get('OMP_WAIT_POLICY'), t.passive_wait(), 'torch' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.stdout.split() == ["None", "True", "False"], out.stderr
    src = open(os.path.join(ROOT, "train.py")).read()
    assert src.index("threads.passive_wait()") < src.index("import hydra")  # before anything that may import torch
    env["OMP_WAIT_POLICY"] = "ACTIVE"
    out = subprocess.run([sys.executable, "-c", "import os, fl_lightning.threads as t; print(t.passive_wait(), "
                          "os.environ['OMP_WAIT_POLICY'])"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.stdout.split() == ["False", "ACTIVE"], out.stderr


def test_auto_threads_leave_the_cores_other_jobs_keep_busy(monkeypatch):
    """trainer.threads=auto: the usable CPUs over the processes per node, and no more than the CPUs other jobs
    leave idle when the run starts (instantaneous runnable count); a CPU subset a scheduler gave is trusted as is."""
    from fl_lightning import threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "usable_cpus", lambda: 8)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 8)
    for busy, ppn, want in [(0, 1, 8), (3, 1, 5), (8, 1, 1), (20, 1, 1), (0, 2, 4), (3, 2, 2), (None, 1, 8)]:
        monkeypatch.setattr(threads, "others_running", lambda b=busy: b)
        assert threads.auto_threads(ppn) == want, (busy, ppn)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 64)  # 8 of 64 CPUs: a Slurm allocation, load elsewhere
    monkeypatch.setattr(threads, "others_running", lambda: 60)
    assert threads.auto_threads(1) == 8
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.auto_threads(1) == 3


def test_the_running_count_is_read_from_proc_loadavg(monkeypatch):
    import builtins
    import io

    from fl_lightning import threads

    reads = iter(["0.50 0.40 0.30 4/300 123\n", "0.50 0.40 0.30 3/300 123\n", "0.50 0.40 0.30 5/300 123\n"])
    real = builtins.open
    monkeypatch.setattr(builtins, "open", lambda p, *a, **k: io.StringIO(next(reads)) if p == "/proc/loadavg"
                        else real(p, *a, **k))
    assert threads.others_running(samples=3, interval=0) == 2  # the least reading, less this process's thread


def test_auto_threads_give_a_small_model_one_thread(monkeypatch):
    from fl_lightning import threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "usable_cpus", lambda: 8)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(threads, "others_running", lambda: 0)
    assert threads.auto_threads(1, num_params=53_002) == 1
    assert threads.auto_threads(1, num_params=11_000_000) == 8 and threads.auto_threads(1) == 8


def test_a_part_that_reads_another_names_one_of_the_methods_parts(tmp_path):
    """Parts declare the other parts whose state they read (``Part.reads_parts``); a name that is not a part of the
    method is one line naming the full key."""
    from tests.helpers.cli import FAST, build_error

    msg = build_error(FAST + ["method=fedsmum", "method.parts.completion.momentum_of=nope"], tmp_path)
    assert msg.startswith("config error: method.parts.completion.momentum_of: names no part of this method ('nope')")
    assert "aggregation" in msg
    msg = build_error(FAST + ["method=fedsmumc", "method.parts.momentum.momentum_of=local_optimizer"], tmp_path)
    assert msg.startswith("config error: method.parts.momentum.momentum_of: part 'local_optimizer' keeps no Lion "
                          "momentum"), msg


def test_build_checks_nothing_in_a_checked_config(tmp_path):
    """One check per run (issue 48): once ``config.check_run`` passed (the command line runs it before torch loads),
    ``build`` hands ``cfg`` to no checking code of the config package again: it only builds (``instantiate``), reads
    the keys' declarations (hash, step budget) and checks what the data decides on values (``fl.num_clients=auto``)."""
    import sys

    from fl_lightning.run.build import build
    from tests.helpers.cli import make_cfg

    checking = ("checks", "args", "groups", "run_check", "paper_block", "keys")
    calls: list[str] = []

    def profile(frame, event, arg):
        if event == "call":
            mod = frame.f_globals.get("__name__", "")
            if mod.startswith("fl_lightning.config.") and mod.rsplit(".", 1)[1] in checking:
                calls.append(f"{mod}.{frame.f_code.co_name}")

    cfg = make_cfg(["fl.rounds=1", "fl.num_clients=4", "fl.clients_per_round=2"], tmp_path / "r")
    sys.setprofile(profile)
    try:
        build(cfg, str(tmp_path / "r"), checked=True)
    finally:
        sys.setprofile(None)
    assert calls == []
    sys.setprofile(profile)  # the check itself is seen by the same probe (the probe can fail)
    try:
        from fl_lightning.config import check_run
        check_run(cfg)
    finally:
        sys.setprofile(None)
    assert "fl_lightning.config.checks.check" in calls and "fl_lightning.config.args.check_targets" in calls
