"""The options eagle3.eval.speedup (--wallclock) and eagle3.serve share with a run's eval.accept and eval.serve:
their defaults, help and checks come from AcceptEvalConfig and ServeEvalConfig (eagle3/config/training.py), as
python -m eagle3.eval.accept's do (tests/test_schemas.py)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("argv,message", [
    (["--num-prompts", "0"], "--num-prompts (eval.accept.num_prompts): must be >= 1, got 0"),
    (["--max-new-tokens", "1"], "--max-new-tokens (eval.accept.max_new_tokens): must be >= 2"),
])
def test_wallclock_options_are_refused_with_the_schema_message(argv, message):
    from eagle3.cli.speedup import main

    with pytest.raises(SystemExit) as e:  # refused before any model is loaded (there is none to load)
        main(["--accept-rates", "0.5", "--measure", *argv])
    assert str(e.value.code).startswith(f"error: {message}")


def test_wallclock_options_take_their_help_from_the_schema(capsys):
    from eagle3.cli.speedup import parse_args

    args = parse_args([])
    assert (args.num_prompts, args.max_new_tokens, args.device) == (8, 64, "auto")
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "prompts decoded by --wallclock (default: 8, as eval.accept.num_prompts)" in text


@pytest.mark.parametrize("argv,message", [
    (["--k", "2", "0"], "--k (eval.serve.k): must be null or a list of k >= 1, got [2, 0]"),
    (["--num-prompts", "0"], "--num-prompts (eval.accept.num_prompts): must be >= 1, got 0"),
    (["--max-new-tokens", "1"], "--max-new-tokens (eval.accept.max_new_tokens): must be >= 2"),
])
def test_serve_options_are_refused_with_the_schema_message(argv, message, tmp_path):
    from eagle3.cli.serve import main

    with pytest.raises(SystemExit) as e:  # refused before the run dir is read (there is none)
        main([str(tmp_path / "no-run"), *argv])
    assert str(e.value.code).startswith(f"error: {message}")


def test_serve_options_take_their_defaults_and_help_from_the_schema(capsys):
    from eagle3.cli.serve import parse_args
    from eagle3.config import AcceptEvalConfig

    args, schema = parse_args(["RUN"]), AcceptEvalConfig()
    assert (args.num_prompts, args.max_new_tokens, args.temperature) == (schema.num_prompts, schema.max_new_tokens,
                                                                         schema.temperature)
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "tokens generated per prompt (default: 32, as eval.accept.max_new_tokens)" in text
