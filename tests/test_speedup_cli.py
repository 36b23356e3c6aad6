"""eagle3.eval.speedup's --wallclock options are eval.accept's: their defaults' help and their checks come from
AcceptEvalConfig (eagle3/config.py), as python -m eagle3.eval.accept's do."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("argv,message", [
    (["--num-prompts", "0"], "--num-prompts (eval.accept.num_prompts): must be >= 1, got 0"),
    (["--max-new-tokens", "1"], "--max-new-tokens (eval.accept.max_new_tokens): must be >= 2"),
])
def test_wallclock_options_are_refused_with_the_schema_message(argv, message):
    from eagle3.eval.speedup import main

    with pytest.raises(SystemExit) as e:  # refused before any model is loaded (there is none to load)
        main(["--accept-rates", "0.5", "--measure", *argv])
    assert str(e.value.code).startswith(f"error: {message}")


def test_wallclock_options_take_their_help_from_the_schema(capsys):
    from eagle3.eval.speedup import parse_args

    args = parse_args([])
    assert (args.num_prompts, args.max_new_tokens, args.device) == (8, 64, "auto")
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "prompts decoded by --wallclock (default: 8, as eval.accept.num_prompts)" in text
