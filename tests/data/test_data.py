"""Data preparation: the tiny verifier is deterministic and the written hidden states are the right layers."""

from __future__ import annotations

from dataclasses import asdict, replace

import pytest
import torch
from safetensors.torch import load_file

from eagle3.config import SynthConfig, TinyVerifierConfig
from eagle3.data.prepare import write_dataset
from eagle3.data.synthetic import sample_rows, synthetic_dataset_dir
from eagle3.errors import ConfigError, DataError
from eagle3.verifier.model import Verifier
from eagle3.verifier.tiny import tiny_verifier_dir
from factories import disk_free, disk_full_after

TINY = TinyVerifierConfig(hidden_size=64, num_layers=4, num_heads=4, intermediate_size=128, vocab_size=256,
            max_position_embeddings=128, init_std=0.02, logit_scale=40.0, seed=0, perturb_std=0.0, token_shift=0.0,
            perturb_seed=1)
SYNTH = SynthConfig(num_samples=6, prompt_len=4, response_len=12, temperature=1.0, batch_size=4, seed=0)


def test_tiny_verifier_is_deterministic_and_peaked(tmp_path):
    a = Verifier(tiny_verifier_dir(TINY, str(tmp_path / "a"))).load()
    b = Verifier(tiny_verifier_dir(TINY, str(tmp_path / "b"))).load()
    for (name, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(pa, pb), name
    with torch.no_grad():
        probs = torch.softmax(a(torch.randint(0, 256, (4, 32))).logits, -1)
    assert probs.max(-1).values.mean() > 0.3  # far from uniform (1/256)


def test_sampling_is_seeded_and_masks_the_prompt(tmp_path):
    model = Verifier(tiny_verifier_dir(TINY, str(tmp_path))).load()
    rows = sample_rows(model, SYNTH)
    assert rows == sample_rows(model, SYNTH)
    assert len(rows) == 6
    for ids, mask in rows:
        assert len(ids) == len(mask) == 16 and mask == [0] * 4 + [1] * 12


def test_hidden_states_are_the_configured_layers(tmp_path):
    model = Verifier(tiny_verifier_dir(TINY, str(tmp_path))).load()
    rows = [([1, 2, 3, 4, 5, 6, 7], [0, 0, 1, 1, 1, 1, 1]), ([9, 8, 7], [0, 1, 1])]  # uneven: padding must not leak
    out = tmp_path / "data"
    write_dataset(model, tiny_verifier_dir(TINY, str(tmp_path)), rows, out, aux_layer_ids=[1, 2, 3], batch_tokens=14,
                  dtype=torch.float32)
    for i, (ids, _) in enumerate(rows):
        saved = load_file(str(out / "hidden_states" / f"hs_{i}.safetensors"))
        assert saved["token_ids"].tolist() == ids
        with torch.no_grad():
            ref = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        hs = saved["hidden_states"]
        assert hs.shape == (len(ids), 4, 64)
        for slot, layer in enumerate([1, 2, 3]):
            torch.testing.assert_close(hs[:, slot], ref[layer][0], rtol=1e-4, atol=1e-5)
        # The last slot is the final layer's output before the final norm (HF's last hidden state is after it).
        with torch.no_grad():
            torch.testing.assert_close(model.model.norm(hs[:, 3]), ref[-1][0], rtol=1e-4, atol=1e-5)
        assert not torch.allclose(hs[:, 3], ref[-1][0])
    assert (out / "token_freq.pt").is_file()
    freq = torch.load(out / "token_freq.pt", weights_only=True)
    assert sum(freq.values()) == 5 + 2  # loss-masked tokens only


def test_token_counts_are_the_file_speculators_writes_for_the_same_rows(tmp_path):
    """token_freq.pt as eagle3 writes it (eagle3.formats.vocab, without importing speculators) is the dict
    speculators' save_token_frequency_distribution writes for the same rows, and both draft vocabularies built
    from it are speculators' (build_vocab_mappings_from_distribution)."""
    from datasets import Dataset
    from speculators.train.vocab_mapping import (
        build_vocab_mappings_from_distribution,
        save_token_frequency_distribution,
    )

    from eagle3.formats.vocab import read_token_freq, vocab_mapping, write_token_freq

    gen = torch.Generator().manual_seed(0)
    rows = [(torch.randint(0, 50, (n,), generator=gen).tolist(), [0] * (n // 3) + [1] * (n - n // 3))
            for n in (5, 17, 40, 3)]
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    write_token_freq(rows, ours / "token_freq.pt")
    dataset = Dataset.from_dict({"input_ids": [i for i, _ in rows], "loss_mask": [m for _, m in rows]})
    save_token_frequency_distribution(dataset.with_format("torch"), str(theirs / "token_freq.pt"))
    freq = read_token_freq(ours)
    assert freq == torch.load(theirs / "token_freq.pt", weights_only=True) and sum(freq.values()) == 4 + 12 + 27 + 2
    d2t, t2d = vocab_mapping(ours, 16, 50)
    expected = build_vocab_mappings_from_distribution(freq, 16, 50)
    assert torch.equal(d2t, expected[0]) and torch.equal(t2d, expected[1])


def test_a_row_whose_mask_is_not_one_value_per_id_is_one_message_and_no_counts_are_written(tmp_path):
    from datasets import Dataset

    from eagle3.data.token_rows import rows_with_counts

    rows = tmp_path / "rows"
    Dataset.from_dict({"input_ids": [[5, 6, 7], [3, 4, 5, 6]], "loss_mask": [[0, 1, 1], [1, 1]],
                       "seq_len": [3, 4]}).save_to_disk(str(rows))
    files = sorted(p.name for p in rows.iterdir())
    with pytest.raises(DataError, match=rf"^{rows}: row 2 has 4 input ids and 2 loss mask values"):
        rows_with_counts(rows)
    assert sorted(p.name for p in rows.iterdir()) == files  # no token_freq.pt, no temporary file


def test_synthetic_dataset_is_cached_by_its_parameters(tmp_path):
    verifier = tiny_verifier_dir(TINY, str(tmp_path))
    first = synthetic_dataset_dir(verifier, SYNTH, [1, 2, 3], str(tmp_path))
    stamp = (first / "state.json").stat().st_mtime_ns
    assert synthetic_dataset_dir(verifier, SYNTH, [1, 2, 3], str(tmp_path)) == first
    assert (first / "state.json").stat().st_mtime_ns == stamp
    other = synthetic_dataset_dir(verifier, SynthConfig(**{**asdict(SYNTH), "seed": 1}), [1, 2, 3], str(tmp_path))
    assert other != first
    assert len(list((first / "hidden_states").glob("hs_*.safetensors"))) == 6


def test_a_derived_verifier_is_related_but_moves_the_frequent_tokens(tmp_path):
    base = Verifier(tiny_verifier_dir(TINY, str(tmp_path))).load()
    derived = Verifier(tiny_verifier_dir(replace(TINY, perturb_std=0.5, token_shift=0.5), str(tmp_path))).load()
    ids = torch.randint(0, 256, (8, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = base(ids).logits.argmax(-1), derived(ids).logits.argmax(-1)
    agreement = (a == b).float().mean()
    assert 5 / 256 < agreement < 0.95  # another model (most argmaxes move), not a stranger (far above chance)


def test_the_check_cli_refuses_a_total_seq_len_no_micro_batch_can_hold(tmp_path, capsys):
    """--total-seq-len 0 used to run the check and advise preparing with --max-len 1."""
    from eagle3.cli.check import main

    with pytest.raises(SystemExit) as stop:
        main([str(tmp_path), "--total-seq-len", "0"])
    assert stop.value.code == 2
    assert "--total-seq-len (data.total_seq_len): must be at least 2" in capsys.readouterr().err


def test_sampling_from_a_verifier_with_nan_weights_is_one_data_error(tmp_path):
    """torch.multinomial's own failure was a traceback; a NaN in the verifier stops with one message."""
    from eagle3.errors import DataError

    model = Verifier(tiny_verifier_dir(TINY, str(tmp_path))).load()
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[0, 0] = float("nan")
    with pytest.raises(DataError, match="next-token probabilities are not finite"):
        sample_rows(model, SynthConfig(num_samples=2, prompt_len=4, response_len=4, batch_size=2))


@pytest.fixture
def dataset(tmp_path):
    """A small offline dataset (rows, hidden states, token_freq.pt and its record) of the tiny verifier."""
    verifier = tiny_verifier_dir(TINY, str(tmp_path))
    return synthetic_dataset_dir(verifier, SYNTH, [1, 2, 3], str(tmp_path))


def test_check_and_training_refuse_a_token_freq_that_is_not_token_counts_alike(dataset, capsys):
    """token_freq.pt holding any other pickle passed `eagle3.data.check` ("all good") while training refused it, quoting
    torch's advice to load it with weights_only=False (to run whatever it holds): one reader for both, whose
    message says what the file should be."""
    from fractions import Fraction

    from commands import exit_status_of
    from eagle3.cli.check import main
    from eagle3.errors import DataError
    from eagle3.formats.vocab import vocab_mapping

    torch.save({1: Fraction(1, 3)}, dataset / "token_freq.pt")  # a class no weights_only load allows
    assert exit_status_of(main, [str(dataset)]) == 1
    out = capsys.readouterr()
    said = out.err.strip()
    assert said.startswith(f"error: {dataset / 'token_freq.pt'} is not a token-count file: torch.save of a "
                           f"{{token id: count}} dict"), out
    assert "weights_only" not in said and "Traceback" not in said and "all good" not in out.out
    with pytest.raises(DataError) as refused:
        vocab_mapping(dataset, 64, TINY.vocab_size)
    assert said == f"error: {refused.value}"


def test_check_says_what_a_token_row_dataset_is(tmp_path, capsys):
    """Rows without hidden states (what data=online and data=regenerate build and read) were "48 of 48 rows are bad:
    missing_file 48": they are a token-row dataset, checked as one, and the check says where it is usable."""
    from eagle3.cli.check import main
    from eagle3.data.token_rows import save_rows

    save_rows([([1, 2, 3, 4], [0, 1, 1, 1]), ([5, 6, 7], [0, 0, 1])], tmp_path / "rows")
    assert main([str(tmp_path / "rows")]) == 0
    out = capsys.readouterr().out
    assert f"{tmp_path / 'rows'} is a token-row dataset: Arrow rows without hidden states, by design" in out, out
    assert f"data=online data.path={tmp_path / 'rows'}; data=offline needs hidden_states" in out
    assert "2 rows, all good (token ids and loss masks)" in out and "missing_file" not in out


def test_a_full_disk_while_caching_the_synthetic_data_is_one_error_and_leaves_no_entry(tmp_path, monkeypatch):
    verifier_dir = tiny_verifier_dir(TINY, str(tmp_path))
    disk_full_after(2, monkeypatch)
    with pytest.raises(DataError, match="no space left .* synthetic dataset; nothing half-built is kept.*cache_dir"):
        synthetic_dataset_dir(verifier_dir, SYNTH, [1, 2, 3], str(tmp_path))
    assert list((tmp_path / "datasets").iterdir()) == []


def test_the_cache_is_refused_when_its_disk_cannot_hold_the_hidden_states(tmp_path, monkeypatch):
    verifier_dir = tiny_verifier_dir(TINY, str(tmp_path))
    disk_free(4096, monkeypatch)
    with pytest.raises(ConfigError, match="GiB free, but the hidden states of these rows need .*cache_dir"):
        synthetic_dataset_dir(verifier_dir, SYNTH, [1, 2, 3], str(tmp_path))
    assert list((tmp_path / "datasets").iterdir()) == []
