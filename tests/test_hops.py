"""The gate audit of multi-hop look-ups: shares on planted gates and attention, then a tiny
var-chain run through probes, the audit and its figure."""

import textwrap

import numpy as np
import pytest

from ddl_dynamics.analysis.hops import hop_audit, seed_audit
from ddl_dynamics.analysis.run import load_run
from ddl_dynamics.cli import main


def test_seed_audit_counts_gates_where_attention_reads_a_hop():
    """Two sequences of 4 tokens, the query at position 3 reads positions 1 then 0; two
    blocks (sublayers attention, MLP, attention, MLP), one head."""
    hops = np.full((2, 4, 2), -1)
    hops[:, 3] = [1, 0]
    looks = np.zeros((2, 4, 2, 1), dtype=int)
    looks[0, 3, :, 0] = [1, 3]  # sequence 0: block 0 reads hop 1, block 1 looks at itself
    looks[1, 3, :, 0] = [1, 0]  # sequence 1: both hops
    beta = np.full((2, 4, 4), 0.1)  # identity, except:
    beta[0, 3] = [1.0, 0.1, 1.6, 1.0]  # projects at its hop, over-relaxed elsewhere
    beta[1, 3] = [1.0, 0.5, 0.2, 0.9]  # projects at hop 1 only
    audit = seed_audit(hops, looks, beta)
    assert audit["at_hops"] == pytest.approx(2 / 3)  # 3 hopping sublayers, 2 project
    assert audit["elsewhere"] == pytest.approx(2 / 5)  # 5 others: 1.0 and 0.9 project
    assert audit["followed"] == pytest.approx(3 / 4)  # hops read: 1 of 2, then 2 of 2
    np.testing.assert_allclose(audit["profile"], [1.0, 0.3, 0.9, 0.95])


def test_seed_audit_reads_each_update_of_a_product_block_at_its_sublayer():
    """As above with two updates per sublayer (a Householder product): each of the hopping
    attention sublayer's updates counts as hopping, the MLP's do not."""
    hops = np.full((1, 4, 2), -1)
    hops[:, 3] = [1, 0]
    looks = np.zeros((1, 4, 2, 1), dtype=int)
    looks[0, 3, :, 0] = [1, 3]  # block 0 reads hop 1, block 1 looks at itself
    beta = np.full((1, 4, 8), 0.1)
    beta[0, 3] = [1.0, 0.2, 1.0, 1.0, 0.1, 0.1, 0.1, 1.0]  # updates of att, MLP, att, MLP
    audit = seed_audit(hops, looks, beta)
    assert audit["at_hops"] == pytest.approx(1 / 2)  # block 0's attention: 1.0 and 0.2
    assert audit["elsewhere"] == pytest.approx(3 / 6)  # 1.0, 1.0 (MLP 0) and 1.0 (MLP 1)


TINY = """
name = "hops"
seeds = [0, 1]
[defaults.model]
width = 8
depth = 2
heads = 2
[defaults.train]
steps = 6
eval_every = 3
batch_size = 16
n_train = 64
n_test = 32
[[tasks]]
name = "var-chain"
spec = { hops = [1, 2] }
[[models]]
name = "transformer"
[[models]]
name = "ddl-transformer"
[[models]]
name = "ddl-write-transformer"
"""


def test_hop_audit_of_a_run_and_its_figure(tmp_path, capsys):
    experiment = tmp_path / "hops.toml"
    experiment.write_text(textwrap.dedent(TINY))
    run_dir = tmp_path / "run"
    assert main(["run", str(experiment), "--run-dir", str(run_dir)]) == 0
    capsys.readouterr()
    assert main(["plot", "hops", str(run_dir)]) == 0
    written = capsys.readouterr().out.split()
    assert sorted(p.rsplit("/", 1)[-1] for p in written) == [
        "hop_gates_ddl-transformer.png",
        "hop_gates_ddl-transformer.svg",
    ]  # erase only
    (audit,) = hop_audit(load_run(run_dir))
    assert (audit.model, audit.family, audit.knob, audit.setting) == (
        "ddl-transformer",
        "var-chain",
        "hops",
        "",
    )
    assert [v for v, _ in audit.at_hops] == [1.0, 2.0] == [v for v, _ in audit.followed]
    assert all(e.n == 2 and 0 <= e.mean <= 1 for _, e in audit.followed)
    assert all(len(betas) == 4 for _, betas in audit.profile)  # 2 blocks, 2 sublayers each
