"""The peer update rules: ddl-product, ddl-decoupled, hc and mhc — their identities with ddl
and resnet, the probe rows they give the gate audit, sizing, folding, and the docs example."""

import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from hyper_connections.manifold_constrained_hyper_connections import log_domain_sinkhorn_knopps

from ddl_dynamics import (
    check_model,
    count_parameters,
    list_models,
    make_model,
    normalize_direction,
)
from ddl_dynamics.analysis.probes import _gate_arrays
from ddl_dynamics.experiment import folder as run_folder
from ddl_dynamics.experiment.folder import load_task_file
from ddl_dynamics.models.base import MODELS
from ddl_dynamics.models.decoupled import decoupled_update
from ddl_dynamics.models.ensemble import fold
from ddl_dynamics.models.params import match_hidden

PEERS = ["ddl-decoupled", "ddl-product", "ddl-write-product", "hc", "mhc"]
BASE = {"in_dim": 3, "out_dim": 2, "width": 8, "depth": 4, "hidden": 8}
PAGE = Path(__file__).resolve().parents[1] / "docs" / "adding-a-model.md"


def model(name: str, **options):
    torch.manual_seed(0)
    return make_model(name, **{**BASE, **options})


def test_the_peers_are_listed_with_one_line_each():
    described = dict(MODELS.describe())
    assert set(PEERS) <= set(list_models())
    for name in PEERS:
        assert described[name] and "\n" not in described[name]


@pytest.mark.parametrize(
    "variant",
    [
        ("ddl-product", {}),
        ("ddl-product", {"product": 3, "value_channels": 2}),
        ("ddl-product", {"product": 2, "tied": True, "control_dim": 2, "value_source": "input"}),
        ("ddl-product", {"context": "control", "control_dim": 2}),
        ("ddl-decoupled", {}),
        ("ddl-decoupled", {"value_channels": 4, "beta_max": 1.0}),
        ("ddl-decoupled", {"tied": True, "control_dim": 2, "value_source": "input"}),
        ("hc", {}),
        ("hc", {"streams": 2, "tied": True, "control_dim": 2}),
        ("hc", {"streams": 1}),
        ("mhc", {}),
        ("mhc", {"streams": 3, "control_dim": 1}),
        ("mhc", {"width": 1}),
    ],
    ids=str,
)
def test_check_model_passes(variant):
    name, options = variant
    check_model(model(name, **options))


@pytest.mark.parametrize(
    "options",
    [{}, {"value_source": "input", "value_channels": 2}, {"tied": True, "control_dim": 2}],
    ids=str,
)
def test_one_householder_step_per_layer_is_ddl(options):
    ddl, product = model("ddl", **options), model("ddl-product", product=1, **options)
    product.load_state_dict(ddl.state_dict())  # the same parameters, name for name
    x = torch.randn(5, 3)
    u = torch.randn(5, 4, 2) if "control_dim" in options else None
    torch.testing.assert_close(product.trajectory(x, u), ddl.trajectory(x, u), rtol=0, atol=0)


def dense_delta(X, k, v, beta):
    """``(I − βkkᵀ)X + βkvᵀ`` with the matrices built out, for one sample batch."""
    eye = torch.eye(k.shape[-1], dtype=X.dtype)
    A = eye - beta[:, None, None] * k[:, :, None] * k[:, None, :]
    return A @ X + beta[:, None, None] * k[:, :, None] * v[:, None, :]


def test_a_product_layer_takes_its_updates_in_turn_from_one_context():
    m = model("ddl-product", product=3, value_channels=2, beta_init=1.5).double()
    state = torch.randn(4, m.state_dim, dtype=torch.float64)
    k_raw, v, beta = m.generators(1, state, None)  # (B, 3, d), (B, 3, d_v), (B, 3)
    X = m.matrix(state)
    for h in range(3):
        X = dense_delta(X, normalize_direction(k_raw[:, h]), v[:, h], beta[:, h])
    torch.testing.assert_close(m.step(1, state, None), X.flatten(-2))


@pytest.mark.parametrize("options", [{}, {"value_channels": 2}], ids=str)
def test_one_write_per_layer_is_ddl_write(options):
    write, product = model("ddl-write", **options), model("ddl-write-product", product=1, **options)
    product.load_state_dict(write.state_dict())
    x = torch.randn(5, 3)
    torch.testing.assert_close(product.trajectory(x), write.trajectory(x), rtol=0, atol=0)


def test_a_two_write_layer_writes_twice_and_never_erases():
    m = model("ddl-write-product", product=2, value_channels=2, beta_init=1.5).double()
    assert not m.erases and model("ddl-product").erases
    state = torch.randn(4, m.state_dim, dtype=torch.float64)
    k_raw, v, beta = m.generators(1, state, None)
    X = m.matrix(state)
    for h in range(2):  # X + β_h k_h v_hᵀ: the dense form without the erase term
        k = normalize_direction(k_raw[:, h])
        X = X + beta[:, h, None, None] * k[:, :, None] * v[:, h, None, :]
    torch.testing.assert_close(m.step(1, state, None), X.flatten(-2))
    assert torch.autograd.gradcheck(lambda s: m.step(1, s, None), (state.requires_grad_(),))


def test_decoupled_update_matches_the_dense_form_and_gradcheck():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(3, 5, 2, dtype=torch.float64, generator=g)
    k = normalize_direction(torch.randn(3, 5, dtype=torch.float64, generator=g))
    v = torch.randn(3, 2, dtype=torch.float64, generator=g)
    beta_e, beta_w = (2 * torch.rand(3, dtype=torch.float64, generator=g) for _ in range(2))
    eye = torch.eye(5, dtype=torch.float64)
    want = (eye - beta_e[:, None, None] * k[:, :, None] * k[:, None, :]) @ X + beta_w[
        :, None, None
    ] * k[:, :, None] * v[:, None, :]
    torch.testing.assert_close(decoupled_update(X, k, v, beta_e, beta_w), want)
    inputs = tuple(t.clone().requires_grad_() for t in (X, k, v, beta_e, beta_w))
    assert torch.autograd.gradcheck(decoupled_update, inputs)


@pytest.mark.parametrize("name", ["ddl-product", "ddl-decoupled"])
def test_gradcheck_one_step(name):
    m = model(name, control_dim=2, value_channels=2).double()
    state = torch.randn(3, m.state_dim, dtype=torch.float64, requires_grad=True)
    u = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s, c: m.step(1, s, c), (state, u))


def tie_gates(ddl, decoupled, d: int, d_v: int, value_source: str) -> None:
    """Load ``ddl``'s weights into ``decoupled`` with its erase and write rows both ddl's gate
    row: the two gates tied."""
    own = decoupled.state_dict()
    for key, value in ddl.state_dict().items():
        if key.endswith(("branch.out.weight", "branch.out.bias")):
            gate_row = value[d : d + 1]
            rest = value[d + 1 :] if value_source == "branch" else value[d + 1 : d + 1]
            value = torch.cat([value[:d], gate_row, gate_row, rest])
        assert own[key].shape == value.shape, key
        own[key] = value
    decoupled.load_state_dict(own)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"value_channels": 2, "beta_init": 1.7},
        {"value_source": "input", "control_dim": 2, "tied": True},
    ],
    ids=str,
)
def test_decoupled_with_tied_gates_is_ddl(options):
    ddl, decoupled = model("ddl", **options), model("ddl-decoupled", **options)
    d_v = options.get("value_channels", 1)
    # perturb the gate rows so that the gates are state-dependent, not the initial constant
    with torch.no_grad():
        for layer in ddl.layers:
            layer.branch.out.weight[BASE["width"] // d_v].normal_()
    tie_gates(ddl, decoupled, BASE["width"] // d_v, d_v, options.get("value_source", "branch"))
    x = torch.randn(6, 3)
    u = torch.randn(6, 4, 2) if "control_dim" in options else None
    torch.testing.assert_close(decoupled.trajectory(x, u), ddl.trajectory(x, u))
    # untied, the write gate moves the output
    with torch.no_grad():
        decoupled.layers[0].branch.out.bias[BASE["width"] // d_v + 1] += 2.0
    assert not torch.allclose(decoupled.trajectory(x, u), ddl.trajectory(x, u))


def test_product_probe_has_a_row_per_update_with_its_own_contraction():
    m = model("ddl-product", product=2, beta_init=1.2)
    with torch.no_grad():
        for layer in m.layers:
            layer.branch.out.weight.normal_()
    probe = m.probe(torch.randn(16, 3))
    assert probe.beta.shape == (16, 4 * 2)
    assert not torch.allclose(probe.beta[:, 0], probe.beta[:, 1])  # each update its own gate
    torch.testing.assert_close(
        probe.e_post, (1 - probe.beta).unsqueeze(-1) * probe.e_pre, atol=1e-5, rtol=1e-4
    )
    assert probe.beta_write is None and "beta_write" not in _gate_arrays(probe)
    assert probe.update.tolist() == [0, 1] * 4  # layer-major: each layer's first, then second


def test_decoupled_probe_shows_both_gates_and_keeps_the_contraction():
    m = model("ddl-decoupled", value_channels=2)
    with torch.no_grad():
        for layer in m.layers:
            layer.branch.out.weight.normal_()
    probe = m.probe(torch.randn(16, 3))
    assert probe.beta.shape == probe.beta_write.shape == (16, 4)
    assert not torch.allclose(probe.beta, probe.beta_write)
    torch.testing.assert_close(
        probe.e_post, (1 - probe.beta).unsqueeze(-1) * probe.e_pre, atol=1e-5, rtol=1e-4
    )
    arrays = _gate_arrays(probe)
    np.testing.assert_array_equal(arrays["beta_write"], probe.beta_write.numpy())


@pytest.mark.parametrize("name, streams", [("hc", 3), ("hc", 1), ("mhc", 1)])
def test_hc_starts_as_resnet_with_the_same_branches(name, streams):
    resnet, hc = model("resnet", control_dim=2), model(name, streams=streams, control_dim=2)
    for i in range(BASE["depth"]):
        hc.layers[i].branch.load_state_dict(resnet.layers[i].state_dict())
    hc.encoder.load_state_dict(resnet.encoder.state_dict())
    hc.decoder.load_state_dict(resnet.decoder.state_dict())
    x, u = torch.randn(5, 3), torch.randn(5, 4, 2)
    torch.testing.assert_close(hc.trajectory(x, u), resnet.trajectory(x, u))
    torch.testing.assert_close(hc(x, u), resnet(x, u))


def test_mhc_mixing_is_doubly_stochastic_and_hc_is_not():
    """With the branch writing nothing, a doubly-stochastic stream mix keeps the streams' sum,
    whatever the mixing weights; Hyper-Connections' unconstrained mix does not."""
    x = torch.randn(5, 3)
    for name, keeps in (("mhc", True), ("hc", False)):
        m = model(name, streams=3)
        with torch.no_grad():
            for layer in m.layers:
                layer.branch.out.weight.zero_()
                layer.branch.out.bias.zero_()
                layer.connection.static_alpha.normal_()
                layer.connection.dynamic_alpha_fn.normal_()
        traj = m.trajectory(x)
        assert torch.allclose(traj[:, -1], traj[:, 0], atol=1e-5) is keeps, name


@pytest.mark.parametrize("options", [{}, {"streams": 3, "tied": True}, {"streams": 1}], ids=str)
def test_a_fresh_hc_mixes_its_streams_by_the_identity(options):
    mixing = model("hc", **options).stream_mixing()
    streams = options.get("streams", 4)
    assert mixing.shape == (BASE["depth"], streams, streams)
    torch.testing.assert_close(mixing, torch.eye(streams).expand_as(mixing))


def test_mhc_stream_mixing_is_the_packages_sinkhorn_and_not_the_identity_at_start():
    """The package's own Sinkhorn of the static weights, doubly stochastic, fresh and after
    the weights moved; fresh, Sinkhorn of the identity logits mixes: e/(e+n−1) on the
    diagonal, 1/(e+n−1) elsewhere."""
    m = model("mhc", streams=3)
    e = math.e
    fresh = m.stream_mixing()
    want = torch.full((3, 3), 1 / (e + 2)).fill_diagonal_(e / (e + 2))
    torch.testing.assert_close(fresh, want.expand_as(fresh))
    with torch.no_grad():
        for layer in m.layers:
            layer.connection.static_alpha.normal_()
    mixing = m.stream_mixing()
    for layer, got in zip(m.layers, mixing, strict=True):
        torch.testing.assert_close(
            got, log_domain_sinkhorn_knopps(layer.connection.static_alpha[:, 1:].detach())
        )
    for dim in (-1, -2):
        torch.testing.assert_close(mixing.sum(dim), torch.ones(BASE["depth"], 3))
    assert not torch.allclose(mixing, fresh, atol=1e-2)


@pytest.mark.parametrize("name", PEERS)
@pytest.mark.parametrize("width", [32, 1])
def test_parameters_match_resnet_within_ten_percent(name, width):
    common = {"in_dim": 3, "out_dim": 2, "control_dim": 2, "width": width, "depth": 8}
    target = count_parameters(make_model("resnet", hidden=32, **common))
    hidden = match_hidden(name, target, **common)
    assert abs(count_parameters(make_model(name, hidden=hidden, **common)) - target) <= 0.1 * target


@pytest.mark.parametrize(
    "variant",
    [
        ("ddl-product", {}),
        ("ddl-decoupled", {}),
        ("hc", {}),
        ("mhc", {}),
        ("mhc", {"tied": True, "streams": 2}),
    ],
    ids=str,
)
def test_peers_fold_into_ensembles(variant):
    """The members' outputs and gradients, computed as one folded ensemble (hc and mhc: the
    package's layers under vmap over the stacked weights)."""
    name, options = variant
    members = [model(name, control_dim=2, **options) for _ in range(3)]
    for seed, m in enumerate(members):
        torch.manual_seed(seed)
        for p in m.parameters():
            p.data.normal_(0, 0.3)
    ensemble = fold(members)
    assert ensemble is not None and ensemble.size == 3
    x, u = torch.randn(3 * 4, 3), torch.randn(3 * 4, 4, 2)
    folded = ensemble.module(x, u)
    own = torch.cat([m(x[4 * s : 4 * s + 4], u[4 * s : 4 * s + 4]) for s, m in enumerate(members)])
    torch.testing.assert_close(folded, own, atol=1e-5, rtol=1e-4)
    folded.square().sum().backward()
    own.square().sum().backward()
    for stack, params in ensemble.slots:
        for s, p in enumerate(params):
            torch.testing.assert_close(stack.grad[s], p.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("ddl-product", {"product": 0}, "product must be an integer >= 1"),
        ("hc", {"streams": 0}, "streams must be an integer >= 1"),
        ("mhc", {"streams": 1.5}, "streams must be an integer >= 1"),
    ],
)
def test_bad_options_raise(name, options, message):
    with pytest.raises(ValueError, match=message):
        model(name, **options)


def page_block(language: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), flags=re.S)
    assert len(blocks) == 1, f"the page has {len(blocks)} {language} blocks, not one"
    return blocks[0]


@pytest.fixture
def scratch_registry(monkeypatch):
    """Models a test's file registers are gone after it (so other tests see the built-ins
    alone), and the file imports again in the next test."""
    list_models()  # the built-ins first, so that the copy holds them
    monkeypatch.setattr(MODELS, "_factories", dict(MODELS._factories))
    monkeypatch.setattr(run_folder, "_imported", dict(run_folder._imported))


@pytest.mark.usefixtures("scratch_registry")
def test_the_docs_example_family_loads_checks_and_is_ddl_decoupled(tmp_path):
    path = tmp_path / "my_decoupled.py"
    path.write_text(page_block("python"))
    assert "model:my-decoupled" in load_task_file(path)
    mine, shipped = model("my-decoupled", control_dim=2), model("ddl-decoupled", control_dim=2)
    check_model(mine)
    with torch.no_grad():
        for a, b in zip(mine.layers, shipped.layers, strict=True):
            a.out.weight.normal_()
            b.branch.load_state_dict(a.state_dict())
    shipped.encoder.load_state_dict(mine.encoder.state_dict())
    shipped.decoder.load_state_dict(mine.decoder.state_dict())
    x, u = torch.randn(5, 3), torch.randn(5, 4, 2)
    torch.testing.assert_close(mine(x, u, per_step=True), shipped(x, u, per_step=True))


@pytest.mark.usefixtures("scratch_registry")
def test_the_docs_example_runs_from_the_command_line(tmp_path, monkeypatch):
    from ddl_dynamics.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_decoupled.py").write_text(page_block("python"))
    (tmp_path / "my-study.toml").write_text(page_block("toml"))
    command = re.search(r"^ddl-dyn run (.*)$", PAGE.read_text(), flags=re.M).group(1).split()
    assert main(["run", *command, "--seeds", "1"]) == 0
    assert main(["report", "runs/my-study", "--task-file", "my_decoupled.py"]) == 0


def test_gate_use_reads_every_update_of_a_product_layer(tmp_path):
    """Planted ddl-product probes, two updates per layer: at each reflect event one of the
    layer's two gates reflects, elsewhere both sit at the identity."""
    import ddl_dynamics as dd
    from ddl_dynamics.analysis.events import gate_use
    from ddl_dynamics.analysis.run import load_run

    folder = dd.RunFolder.open(tmp_path, "w")
    store = folder.store
    reflection = dd.REGIMES.index("reflection")
    events = dd.make_task("switched", p=0.5, event="reflect").sample(64, 0, "test").step_regimes
    events = events.numpy()
    beta = np.zeros((events.shape[0], 2 * events.shape[1]))
    beta[:, 0::2] = np.where(events == reflection, 2.0, 0.0)  # the first update of a layer
    for p in (0.5, 1.0):
        task = f"switched[event=reflect,p={p:g}]"
        r = dd.RunResult(
            status="ok",
            message="",
            key=f"{task}-ddl-product-0",
            task=task,
            model="ddl-product",
            seed=0,
            params=100,
            flops=1.0,
            wall_time=1.0,
            config={
                "task": "switched",
                "spec": {"depth": 8, "p": p, "event": "reflect", "dim": 4},
                "model": "ddl-product",
                "config": {},
            },
            metrics={"metric": "mse", "higher_is_better": False, "test": 0.1},
        )
        store.put(r)
        for path in (folder.model_path(r.key), folder.probe_path(r.key)):
            path.parent.mkdir(exist_ok=True)
        folder.model_path(r.key).touch()
        np.savez(folder.probe_path(r.key), beta=beta, test_step_regimes=events)
    (found,) = gate_use(load_run(tmp_path))
    assert (found.model, found.regime) == ("ddl-product", "reflection")
    assert [e.mean for _, e in found.at_events] == [0.5, 0.5]
    assert [e.mean for _, e in found.elsewhere] == [0.0, 0.0]


def test_the_gate_audit_and_regime_figures_cover_the_delta_peers(tmp_path):
    """A tiny trained run: the report's regime audit and the regime figures have a row and a
    figure for ddl-product (its updates as layers) and ddl-decoupled (its erase gate), and
    the decoupled probe keeps its write gate."""
    import ddl_dynamics as dd
    from ddl_dynamics.analysis.probes import usable_rows
    from ddl_dynamics.analysis.run import load_run

    (tmp_path / "tiny.toml").write_text("""
name = "tiny"
seeds = [0]
[defaults.model]
width = 8
depth = 3
hidden = 8
[defaults.train]
steps = 10
batch_size = 16
n_train = 64
n_test = 32
eval_every = 5
[[tasks]]
name = "overwrite"
spec = { depth = 3 }
[[models]]
name = "resnet"
[[models]]
name = "ddl-product"
product = 2
[[models]]
name = "ddl-decoupled"
""")
    run_dir = tmp_path / "run"
    dd.run_experiment(dd.load_experiment(tmp_path / "tiny.toml"), run_dir=run_dir)
    figures = {p.stem for p in dd.make_figures(run_dir, ("regimes",), progress=False)}
    assert {"regime_atlas_ddl-product", "regime_atlas_ddl-decoupled"} <= figures
    regimes = {row.model: row for row in dd.build_report(run_dir).regimes}
    assert set(regimes) == {
        "ddl-product",
        "ddl-product (update 1)",
        "ddl-product (update 2)",
        "ddl-decoupled",
    }
    pooled = np.mean(
        [list(regimes[f"ddl-product (update {h})"].fractions.values()) for h in (1, 2)], axis=0
    )  # two updates a layer, equally many each
    np.testing.assert_allclose(list(regimes["ddl-product"].fractions.values()), pooled)
    run = load_run(run_dir)
    arrays = {row.model: run.folder.probe(row.key) for row in usable_rows(run)}
    assert arrays["ddl-product"]["beta"].shape[1] == 3 * 2
    assert arrays["ddl-decoupled"]["beta_write"].shape == arrays["ddl-decoupled"]["beta"].shape
    assert "beta" not in arrays["resnet"]


def test_the_report_says_how_far_the_stream_mixing_moved(mixing_run, tmp_path):
    """The trained hc and mhc rows of a tiny run moved their mixing; with every stored weight
    put back at its start but one layer's mixing set (hc: I + D, ‖D‖_F = 0.5; mhc: the
    weights log P, whose Sinkhorn is P, ‖P − I‖_F = 0.5), the table gives the distances set,
    mhc's start measured by the package's Sinkhorn."""
    import ddl_dynamics as dd
    from ddl_dynamics.analysis.probes import usable_rows
    from ddl_dynamics.analysis.render.formats import render
    from ddl_dynamics.analysis.render.html import render_html
    from ddl_dynamics.analysis.run import load_run
    from ddl_dynamics.experiment.config import Cell

    trained = {r.model: r for r in dd.build_report(mixing_run).mixing}
    assert list(trained) == ["hc", "mhc"]
    assert all(r.seeds == 2 and r.streams == 2 and r.from_start > 0 for r in trained.values())
    run = load_run(shutil.copytree(mixing_run, tmp_path / "run"))
    eye, p = torch.eye(2), torch.tensor([[0.75, 0.25], [0.25, 0.75]])
    set_to = {"hc": eye + torch.diag(torch.tensor([0.3, -0.4])), "mhc": p.log()}
    for row in usable_rows(run):
        if row.model in set_to:
            _, fresh = Cell.from_dict(row.config).build()
            if row.seed == 0:
                with torch.no_grad():
                    fresh.layers[1].connection.static_alpha[:, 1:] = set_to[row.model]
            torch.save(fresh.state_dict(), run.folder.model_path(row.key))
    report = dd.build_report(run.run_dir)
    start = torch.linalg.matrix_norm(log_domain_sinkhorn_knopps(eye) - eye).item()
    moved = torch.linalg.matrix_norm(p - log_domain_sinkhorn_knopps(eye)).item()
    layers = 2 * 3  # seeds × depth
    want = {
        "hc": (0.5 / layers, 0.5, 0.5 / layers, 0.5, 0.0),
        "mhc": ((5 * start + 0.5) / layers, start, moved / layers, moved, start),
    }
    assert start == pytest.approx(0.5379, abs=1e-4) and moved > 0.01
    for r in report.mixing:
        got = (r.from_identity, r.from_identity_max, r.from_start, r.from_start_max, r.start)
        assert got == pytest.approx(want[r.model], abs=1e-5), r.model
    markdown = render(report, "md")
    assert "## Stream mixing of the trained Hyper-Connections stacks" in markdown
    assert "| overwrite | hc | 2 | 2 | 0.0833 | 0.5 | 0.0833 | 0.5 | 0 |" in markdown
    assert "Stream mixing of the trained Hyper-Connections stacks</h2>" in render_html(report)
