"""What a run asks of this machine, before anything is written or any rank starts: the plan (eagle3.plan.memory) with
what the machine and the disk say (eagle3.plan.sizes), the guard that refuses a run that cannot fit, and the
devices the config names. Imports torch only inside the functions that need it."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from eagle3.config import TrainConfig

if TYPE_CHECKING:
    from eagle3.plan.parts import Plan

log = logging.getLogger(__name__)


def run_plan(cfg: TrainConfig, measure: bool = False) -> Plan:
    """The plan of this run (eagle3.plan.memory) with what the machine and the disk say (eagle3.plan.sizes), its step
    time from this machine's cached matmul rates (eagle3.plan.roofline); `measure`: the shapes not cached yet are
    measured now (well under a second), as plan=true does."""
    from eagle3.data.sources import source_of
    from eagle3.plan.memory import make_plan
    from eagle3.plan.parts import ACCEPT_VERIFIER, ROLLOUT_VERIFIER, Machine, PlannedRun, SourceFacts, Term, Verifiers
    from eagle3.plan.sizes import device_and_memory, verifier_shape, verifier_size

    draft, dist = cfg.model.draft, cfg.distributed
    kind, memory, source = device_and_memory(cfg.device, dist.device_memory_gb, in_process=dist.world_size == 1,
                                             ranks_per_node=dist.nproc_per_node)
    online = cfg.data.verifier_in_rank() is not None
    # Where every rank holds the verifier (data=online, or on-policy rollouts' copy) eval.accept reuses it; otherwise
    # only eval.accept loads it (rank 0).
    loaded = None
    if not online and (cfg.train.on_policy.enabled or cfg.eval.accept.enabled):
        loaded = Term(ROLLOUT_VERIFIER if cfg.train.on_policy.enabled else ACCEPT_VERIFIER,
                      *verifier_size(cfg.model.verifier))
    data = source_of(cfg.data)
    facts = SourceFacts(data.buffer_terms(draft, kind), data.plan_stats(draft), data.no_rows_reason(),
                        data.hidden_cache_bytes())
    plan = make_plan(PlannedRun.of(cfg), Machine(kind, memory, source, matmul_rates(cfg, kind, measure)), facts,
                     Verifiers(online=verifier_shape(cfg.model.verifier) if online else None, loaded=loaded))
    plan.data_notes += data.plan_notes(cfg)
    return plan


def matmul_rates(cfg: TrainConfig, device_type: str, measure: bool):
    """The plan's source of measured matmul rates on this machine: its cache under cache_dir, the missing shapes
    measured with `measure`; none for a GPU plan on a machine without one."""
    from pathlib import Path

    from eagle3.plan.roofline import rates_for

    if device_type == "cuda":
        from eagle3.engine.venv import has_cuda

        if not has_cuda():  # a GPU plan on a machine without one (torch is not imported to find out)
            return None
    return lambda shapes: rates_for(shapes, Path(cfg.cache_dir), device_type, measure_missing=measure)


def refuse_if_it_cannot_fit(cfg: TrainConfig) -> None:
    """Stops a run whose planned peak per rank exceeds the device's memory (eagle3.plan.memory.check_fits)."""
    from eagle3.plan.report import check_fits, human

    plan = run_plan(cfg)
    check_fits(plan)
    of = f"of {human(plan.device_memory)} ({plan.device_memory_source})" if plan.device_memory else \
        f"({plan.device_memory_source})"
    log.info("plan: about %s per rank %s; eagle3 plan ... for the terms", human(plan.peak), of)


def check_devices(cfg: TrainConfig) -> None:
    """What the config asks of this machine's devices, before anything is built (eagle3.device.choice)."""
    from eagle3.device.choice import runtime_of

    runtime_of(cfg)


def check_new_job(cfg: TrainConfig) -> None:
    """What a new job (not a resume) asks of this machine before anything is built: its verifier dir's config, what
    its data source refuses from the config alone, its devices, and unless it only plans, the initializer's source
    (init.path)."""
    from eagle3.data.sources import source_of
    from eagle3.verifier.shape import check_verifier_dir

    check_verifier_dir(cfg.model)
    source_of(cfg.data).refuse_early(cfg)
    check_devices(cfg)
    if not cfg.plan:
        cfg.init.check_source()
