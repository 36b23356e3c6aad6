"""What the training loop does at the top of each step (eagle3.train.cadence): which of train row, stop, val pass
and save of checkpoints/last are due, given where the run is and the optim/logger settings (pure: no model); and
where the loop calls the hooks a run registers (eagle3.train.loop.Hook), on a real tiny run."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3.rundir.progress import Progress
from eagle3.train.cadence import Cadence, Due, Stop

# 3 epochs of 10 steps, cut at 25 by max_steps; a val pass every 4 steps, `last` every 3, a train row every 2.
CADENCE = Cadence.of(epochs=3, max_steps=25, steps_per_epoch=10, log_every=2, eval_every=4, checkpoint_every=3,
                     max_skipped_steps=5)


def at(step: int, epoch: int | None = None, step_in_epoch: int | None = None, last_val: int | None = None) -> Progress:
    """Progress after `step` steps, its latest val row at `last_val` (default: the step's own epoch start)."""
    epoch = step // 10 if epoch is None else epoch
    step_in_epoch = step - 10 * epoch if step_in_epoch is None else step_in_epoch
    val = {"step": (step - step_in_epoch) if last_val is None else last_val}
    return Progress(step=step, epoch=epoch, step_in_epoch=step_in_epoch, step0={"step": 0}, best=val, final=val)


def test_the_length_is_epochs_of_steps_cut_by_max_steps():
    assert CADENCE.total_steps == 25
    assert Cadence.of(3, None, 10, 1, None, None, 10).total_steps == 30
    assert Cadence.of(3, 0, 10, 1, None, None, 10).total_steps == 0


def test_the_top_of_a_new_run_owes_nothing():
    assert CADENCE.due(at(0)) == Due()


def test_an_eval_every_step_inside_an_epoch_is_validated_then_saved_when_checkpoint_every_falls_on_it_too():
    assert CADENCE.due(at(4, last_val=0), stepped=True) == Due(train_row=True, val_epoch=0)
    both = Cadence.of(3, 25, 10, 2, 4, 2, 5)
    assert both.due(at(12, last_val=10), stepped=True) == Due(train_row=True, val_epoch=1, save=True)
    assert CADENCE.due(at(3, last_val=0), stepped=True) == Due(save=True)  # checkpoint_every alone
    assert CADENCE.due(at(5, last_val=4), stepped=True) == Due()


def test_a_val_pass_after_a_step_follows_a_train_row_off_the_log_every_steps_so_its_tokens_are_its_own():
    sparse = Cadence.of(3, 25, 10, 7, 4, None, 5)  # a train row every 7 steps, a val pass every 4
    assert sparse.due(at(4, last_val=0), stepped=True) == Due(train_row=True, val_epoch=0)
    assert sparse.due(at(10, epoch=0, step_in_epoch=10, last_val=8), stepped=True) == Due(
        train_row=True, next_epoch=True, val_epoch=1, epoch_end=True, save=True)
    assert sparse.due(at(5, last_val=4), stepped=True) == Due()
    assert sparse.due(at(8, last_val=4)) == Due(val_epoch=0)  # a resumed run's owed pass: no step, no row


def test_the_end_of_an_epoch_moves_on_validates_under_the_epochs_begun_and_saves():
    assert CADENCE.due(at(10, epoch=0, step_in_epoch=10, last_val=8), stepped=True) == Due(
        train_row=True, next_epoch=True, val_epoch=1, epoch_end=True, save=True)


def test_max_steps_inside_an_epoch_ends_the_run_without_moving_on_and_logs_its_last_step():
    # 25 is no log_every step, but the run's last: its train row is due.
    assert CADENCE.due(at(25, last_val=24), stepped=True) == Due(train_row=True, val_epoch=3, epoch_end=True,
                                                                 save=True, done=True)


def test_the_end_of_the_last_epoch_ends_the_run():
    whole = Cadence.of(3, None, 10, 2, 4, 3, 5)
    assert whole.due(at(30, epoch=2, step_in_epoch=10, last_val=28), stepped=True) == Due(
        train_row=True, next_epoch=True, val_epoch=3, epoch_end=True, save=True, done=True)


def test_a_finished_run_owes_nothing_and_saves_nothing_again():
    assert CADENCE.due(at(25, last_val=25)) == Due(done=True)


def test_max_steps_0_is_the_probe_alone_saved_as_last():
    assert Cadence.of(3, 0, 10, 2, 4, 3, 5).due(at(0)) == Due(save=True, done=True)


def test_a_signal_landing_on_an_eval_every_step_saves_before_the_val_pass_and_the_resumed_run_owes_it():
    stopped = CADENCE.due(at(8, last_val=4), stepped=True, stop_requested=True)
    assert stopped == Due(train_row=True, stop=Stop.signal)  # the row first: its tokens go into `last`
    # The resumed run at the top of its first step: the pass is due, and nothing that follows only a step.
    assert CADENCE.due(at(8, last_val=4)) == Due(val_epoch=0)
    assert CADENCE.due(at(8, last_val=8)) == Due()  # once done, not again


def test_a_signal_on_an_epochs_last_step_leaves_the_epochs_end_to_the_resumed_run():
    assert CADENCE.due(at(20, epoch=1, step_in_epoch=10, last_val=16), stepped=True,
                       stop_requested=True).stop is Stop.signal
    assert CADENCE.due(at(20, epoch=1, step_in_epoch=10, last_val=16)) == Due(
        next_epoch=True, val_epoch=2, epoch_end=True, save=True)


def test_a_signal_is_read_only_after_a_step_and_a_checkpoint_every_save_only_follows_one():
    assert CADENCE.due(at(3, last_val=0), stop_requested=True) == Due()
    assert CADENCE.due(at(3, last_val=0), stepped=True, stop_requested=True).stop is Stop.signal


def test_too_many_skipped_steps_in_a_row_stop_the_run_before_a_signal_is_heeded():
    assert CADENCE.due(at(7, last_val=4), stepped=True, skipped_in_a_row=4) == Due()
    assert CADENCE.due(at(7, last_val=4), stepped=True, skipped_in_a_row=5,
                       stop_requested=True) == Due(stop=Stop.skipped)


def walk(cadence: Cadence, progress: Progress, stop_at: int | None = None) -> tuple[list[tuple], Progress]:
    """Carries out what is due as eagle3.train.loop's loop does, with a step as a counter: the val passes
    (step, epoch), the saves of `last` (step) and where it ends."""
    events: list[tuple] = []
    stepped = False
    while True:
        due = cadence.due(progress, stepped, 0, stepped and progress.step == stop_at)
        if due.stop is not None:
            return [*events, ("save", progress.step)], progress
        if due.next_epoch:
            progress.epoch, progress.step_in_epoch = progress.epoch + 1, 0
        if due.val_epoch is not None:
            progress.final = {"step": progress.step}
            events.append(("val", progress.step, due.val_epoch))
        if due.save:
            events.append(("save", progress.step))
        if due.done:
            return events, progress
        progress.step += 1
        progress.step_in_epoch += 1
        stepped = True


@pytest.mark.parametrize("cadence", [CADENCE, Cadence.of(2, None, 10, 1, 5, None, 5)])
def test_a_run_stopped_at_any_step_and_resumed_validates_as_the_uninterrupted_run(cadence):
    whole, end = walk(cadence, at(0))
    vals = [e for e in whole if e[0] == "val"]
    assert vals[-1] == ("val", cadence.total_steps, 3 if cadence is CADENCE else 2)
    for stop_at in range(1, cadence.total_steps + 1):
        first, stopped = walk(cadence, at(0), stop_at)
        resumed = Progress.from_dict(stopped.as_dict(), Path("last"))  # as trainer_state.pt holds it
        rest, resumed_end = walk(cadence, resumed)
        assert [e for e in first + rest if e[0] == "val"] == vals, f"stopped at {stop_at}"
        assert set(first + rest) == set(whole) | {("save", stop_at)}, f"stopped at {stop_at}"
        assert resumed_end == end


@pytest.mark.slow
def test_a_registered_hook_is_called_at_each_loop_point_with_the_loops_counters(cache_dir, tmp_path):
    """A feature plugs in as a hook on the object the loop is handed, not as a parameter of `train`: the loop calls
    it at the step-0 val pass, its start, before and after each optimizer step, at each val pass and at its end,
    and the entries its on_val returns land in the val rows."""
    from eagle3.train.loop import Hook, Training, train
    from eagle3.train.track import Tracker
    from factories import read_rows, small_run

    class Recorder(Hook):
        def __init__(self) -> None:
            self.calls: list[tuple] = []

        def on_train_start(self, run, progress):
            self.calls.append(("start", progress.step))

        def step_loss(self, run, step):
            self.calls.append(("step_loss", step))
            return None

        def on_step_end(self, run, progress):
            self.calls.append(("step_end", progress.step, progress.step_in_epoch))

        def on_val(self, run, row):
            self.calls.append(("val", row["step"]))
            return {"hooked_at": row["step"]}

        def on_train_end(self, run, progress):
            self.calls.append(("end", progress.step))

    run_dir = tmp_path / "run"
    cfg, model, loaders = small_run(cache_dir, run_dir, ["optim.max_steps=4", "optim.eval_every=2"])
    hooks = [Recorder(), Recorder()]
    with Tracker(run_dir, cfg.logger, cfg.run) as tracker:
        progress = train(Training(model, loaders, cfg, tracker, hooks=hooks))
    assert progress.step == 4
    assert hooks[0].calls == hooks[1].calls == [
        ("val", 0), ("start", 0),
        ("step_loss", 0), ("step_end", 1, 1), ("step_loss", 1), ("step_end", 2, 2), ("val", 2),
        ("step_loss", 2), ("step_end", 3, 3), ("step_loss", 3), ("step_end", 4, 4), ("val", 4), ("end", 4)]
    assert [(r["step"], r["hooked_at"]) for r in read_rows(run_dir) if r["split"] == "val"] == [(0, 0), (2, 2), (4, 4)]


@pytest.mark.slow
def test_every_row_carries_the_tokens_trained_so_far_the_x_of_a_learning_curve(cache_dir, tmp_path):
    """Train and val rows hold `tokens`, the tokens trained before them (the learning curve's x, read by
    eagle3.sweep.forecast): 0 at the step-0 val pass, rising with every step, a val row's equal to the train row of
    its step, the last equal to summary's count."""
    from eagle3.train.loop import Training, train
    from eagle3.train.track import Tracker
    from factories import read_rows, small_run

    run_dir = tmp_path / "run"
    cfg, model, loaders = small_run(cache_dir, run_dir, ["optim.max_steps=4", "optim.eval_every=2",
                                                         "logger.log_every=1"])
    with Tracker(run_dir, cfg.logger, cfg.run) as tracker:
        progress = train(Training(model, loaders, cfg, tracker))
    rows = read_rows(run_dir)
    train_tokens = {r["step"]: r["tokens"] for r in rows if r["split"] == "train"}
    val_tokens = {r["step"]: r["tokens"] for r in rows if r["split"] == "val"}
    assert sorted(train_tokens) == [1, 2, 3, 4]
    assert all(train_tokens[s] > train_tokens[s - 1] > 0 for s in (2, 3, 4))
    assert val_tokens == {0: 0.0, 2: train_tokens[2], 4: train_tokens[4]}
    assert train_tokens[4] == progress.tokens


@pytest.fixture(scope="module")
def chat_rows(tmp_path_factory) -> tuple[Path, Path]:
    """Issue 47's fixture: a chat verifier of the tests' factories (8 layers, hidden 64, a 201-word vocabulary) and
    30 ShareGPT conversations of 1-3 exchanges, a system turn in every third: rows of many lengths."""
    import json
    import random

    from factories import chat_tokenizer, chat_words, verifier_dir

    root = tmp_path_factory.mktemp("chat_epochs")
    words = chat_words(200) + ["<|system|>"]
    verifier = verifier_dir(root / "ver", hidden_size=64, num_hidden_layers=8, num_attention_heads=4,
                            num_key_value_heads=2, intermediate_size=128, vocab_size=len(words),
                            max_position_embeddings=256, tokenizer=chat_tokenizer(words, eos_token="<|end|>"))
    rand = random.Random(0)

    def say(n: int) -> str:
        return " ".join(f"w{rand.randrange(200)}" for _ in range(n))

    convs = []
    for i in range(30):
        turns = [{"from": "system", "value": say(5)}] if i % 3 == 0 else []
        for _ in range(1 + i % 3):
            turns += [{"from": "human", "value": say(8)}, {"from": "gpt", "value": say(12)}]
        convs.append({"id": f"c{i}", "conversations": turns})
    (root / "sharegpt.json").write_text(json.dumps(convs, indent=2))
    return verifier, root / "sharegpt.json"


@pytest.mark.slow  # three short online runs of the chat rows (12 steps): about a minute on 2 idle cores
def test_epochs_of_chat_rows_of_many_lengths_train_every_row_once_and_resume_exactly_across_an_epoch(
        chat_rows, cache_dir, tmp_path):
    """Issue 47: at total_seq_len=256 and seed 1 speculators' packing put these 27 train rows into 7, then 6
    micro-batches, so epoch 1 ran out of them (StopIteration; an epoch of more micro-batches than the first left
    rows untrained, without a word); now both epochs take the same steps and train every row once, and a run
    stopped in epoch 1 resumes to the uninterrupted run's numbers."""
    import json
    import signal

    import yaml

    from commands import launch, sigterm_in_process_after_step
    from eagle3.formats.arrow_rows import ArrowRows
    from factories import read_rows

    verifier, sharegpt = chat_rows
    args = ["model=auto", f"model.verifier.path={verifier}", "data=online", f"data.path={sharegpt}",
            "data.total_seq_len=256", "seed=1", "optim.epochs=2", "logger.log_every=1", "logger.mode=disabled"]
    reference = tmp_path / "reference"
    proc = launch([f"hydra.run.dir={reference}", *args], cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((reference / "summary.json").read_text())
    train_ratio = yaml.safe_load((reference / "resolved_config.yaml").read_text())["data"]["train_ratio"]
    seq_len = ArrowRows(summary["data_dir"]).seq_len
    train = seq_len[:int(len(seq_len) * train_ratio)]
    assert len(set(train.tolist())) > 1  # rows of different lengths (31, 48 and 72 tokens)
    assert summary["tokens"] == 2 * sum(min(n - 1, 256) for n in train.tolist())  # every row once per epoch
    steps_per_epoch = summary["steps"] // 2
    assert [r["step"] for r in read_rows(reference) if r["split"] == "val"] == [0, steps_per_epoch, 2 * steps_per_epoch]

    stopped = tmp_path / "stopped"
    proc = sigterm_in_process_after_step([f"hydra.run.dir={stopped}", *args], cache_dir, steps_per_epoch + 2)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-2000:]
    assert read_rows(stopped)[-1]["step"] == steps_per_epoch + 2  # stopped in epoch 1, past its val pass
    resumed = launch([f"resume={stopped}"], cache_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    ref_rows, res_rows = read_rows(reference), read_rows(stopped)
    assert [(r["step"], r["split"]) for r in res_rows] == [(r["step"], r["split"]) for r in ref_rows]
    for ours, theirs in zip(res_rows, ref_rows, strict=True):
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-4), ours["step"]
    assert json.loads((stopped / "summary.json").read_text())["tokens"] == summary["tokens"]
