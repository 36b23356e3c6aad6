"""The typed run config: what Hydra composes (TrainConfig, conf/train.yaml) and what a run dir holds (RunConfig), the
schemas stored in Hydra's ConfigStore for the option files' defaults lists, and the way from a plain, resolved
config to a typed, checked one and back."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from eagle3.config.checks import require
from eagle3.config.data import DATA_SCHEMAS, DataConfig, data_schema
from eagle3.config.model import DraftKind, ModelConfig
from eagle3.config.training import (
    INIT_SCHEMAS,
    DistributedConfig,
    EvalConfig,
    InitConfig,
    LoggerConfig,
    LoopConfig,
    OptimConfig,
    PretrainedInitConfig,
    ScratchInitConfig,
)
from eagle3.errors import ConfigError


class Objective(str, Enum):
    """What a run returns to a sweeper (eagle3/sweep/objective.py): its best val tau_sim, or the measured acceptance
    of that val pass."""

    tau_sim = "tau_sim"
    accept_len = "accept_len"


class Device(str, Enum):
    """Where a run trains; auto: a CUDA GPU when torch sees one, else the CPU (eagle3/device/choice.py resolves it)."""

    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


@dataclass
class TrainConfig:
    """What Hydra composes (conf/train.yaml)."""

    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    init: InitConfig = MISSING
    optim: OptimConfig = MISSING
    distributed: DistributedConfig = MISSING
    logger: LoggerConfig = MISSING
    eval: EvalConfig = field(default_factory=EvalConfig)
    train: LoopConfig = field(default_factory=LoopConfig)   # what the loop does besides the data's steps
    seed: int = 0                   # seeds torch (draft init) and the training data order
    cache_dir: str = MISSING
    device: Device = Device.auto    # auto (cuda if present, else cpu) | cpu | cuda
    resume: str | None = None       # a run dir: continue that run in place from its checkpoints/last (no overrides)
    # true: print the run's memory (GiB per rank) and time plan and exit; builds nothing, writes no run dir; exit
    # status 0 if it fits, 3 if it does not, 1 for a refused config. A run always plans first and stops if it
    # cannot fit (eagle3/plan/memory.py)
    plan: bool = False
    # What the run returns to a sweeper (hydra/sweeper=optuna maximises it): tau_sim, the best val tau_sim; or
    # accept_len, the measured acceptance (tokens per verify step) of checkpoints/best: needs
    # eval.accept.enabled=true and eval.accept.every=1, so that the val pass that chose the best checkpoint measured it.
    objective: Objective = Objective.tau_sim

    def check(self, dataset_required: bool = True) -> None:
        """The checks a type cannot express, each raising ConfigError naming the key. `dataset_required=False`:
        data.path need not hold a dataset yet (DataConfig.check)."""
        self.optim.check()
        self.data.check(dataset_required)
        self._check_sharded_verifier()
        self.model.check()
        require(0 <= self.seed < 2**63, "seed", f"must be in [0, 2**63), got {self.seed}")
        require(not (self.device == "cpu" and self.distributed.backend == "nccl"), "distributed.backend",
                "nccl runs on CUDA GPUs only, and device=cpu; use distributed.backend=auto (gloo on CPU)")
        self.distributed.check()
        self.eval.accept.check(self.distributed)
        self.eval.serve.check_values()  # P-EAGLE's rule for vLLM is the draft's (DraftConfig.check)
        self.train.on_policy.check(self.distributed)
        dflash = self.model.draft.kind == DraftKind.dflash
        require(not (dflash and self.train.on_policy.enabled), "train.on_policy.enabled",
                "on-policy rollouts train an EAGLE-3 chain (eagle3/decoding/rollout.py), not a DFlash block: drop it "
                "for model.draft.kind=dflash")
        require(not (dflash and self.init.name != "scratch"), "init.name",
                f"init={self.init.name} reads EAGLE-3 and P-EAGLE checkpoints only; a DFlash draft starts from "
                "init=scratch")
        accept = self.eval.accept
        # accept_len exists only where the val pass that chose the best checkpoint measured acceptance.
        require(self.objective != Objective.accept_len or (accept.enabled and accept.every == 1), "objective",
                "accept_len needs measured acceptance at every val pass: add eval.accept.enabled=true"
                + ("" if accept.every == 1 else " and eval.accept.every=1") + ", or use objective=tau_sim")

    def _check_sharded_verifier(self) -> None:
        """What needs the whole verifier in a rank, refused when the data source shards it across the ranks."""
        if self.data.verifier_in_rank() != "sharded":
            return
        require(not self.eval.accept.enabled, "eval.accept.enabled",
                "measures on rank 0 with the whole verifier, and data.shard_verifier=true shards it across the "
                "ranks; measure the saved checkpoint afterwards with eagle3 accept --run <run dir>")
        require(not self.train.on_policy.enabled, "train.on_policy.enabled",
                "decodes with the whole verifier in each rank, and data.shard_verifier=true shards it across the "
                "ranks")


@dataclass
class RunInfo:
    """What Hydra knows about the job besides its config; the launcher adds it as `run` to the resolved config."""

    dir: str = MISSING
    name: str = MISSING
    group: str = MISSING            # the wandb group: the sweep's for every job of a sweep
    choices: dict[str, str] = field(default_factory=dict)   # group -> option, e.g. {"optim": "tiny"}
    overrides: list[str] = field(default_factory=list)      # the command line's; a value set there is explicit


@dataclass
class RunConfig(TrainConfig):
    """The run config as a run dir holds it (resolved_config.yaml): the composed config plus `run`."""

    run: RunInfo = MISSING


def register_configs() -> None:
    # Sweep sub-dir names come from the overrides; `experiment=k2_to_k25/finetune` must not nest a directory.
    if not OmegaConf.has_resolver("dirname_safe"):
        OmegaConf.register_new_resolver("dirname_safe", lambda s: str(s).replace("/", "-"))
    cs = ConfigStore.instance()
    for schema in DATA_SCHEMAS.values():
        cs.store(group="data", name=f"base_{schema.name}", node=schema)
    cs.store(name="base_train", node=TrainConfig)
    cs.store(group="model", name="base_model", node=ModelConfig)
    cs.store(group="init", name="base_scratch", node=ScratchInitConfig)
    cs.store(group="init", name="base_pretrained", node=PretrainedInitConfig)
    cs.store(group="optim", name="base_optim", node=OptimConfig)
    cs.store(group="distributed", name="base_distributed", node=DistributedConfig)
    cs.store(group="logger", name="base_logger", node=LoggerConfig)


def run_config(plain: dict[str, Any], dataset_required: bool = True) -> RunConfig:
    """The typed, checked run config from its plain form: the resolved composition plus `run`, or a run dir's
    resolved_config.yaml (an old run dir goes through the same schemas and checks as a fresh run).
    `dataset_required=False` is for plan=true, which reads no data: data.path need only be a directory."""
    cfg = _typed(RunConfig, plain, dataset_required)
    assert isinstance(cfg, RunConfig)
    return cfg


def validate(plain: dict[str, Any], dataset_required: bool = True) -> TrainConfig:
    """The typed, checked composed config (no `run` part) from its plain, resolved form (`dataset_required`: as
    for run_config)."""
    return _typed(TrainConfig, plain, dataset_required)


def _typed(schema_type: type[TrainConfig], plain: dict[str, Any], dataset_required: bool = True) -> TrainConfig:
    # Merging into the schemas refuses a key none of them has, which composition lets through when it is added
    # with `+` (`+optim.lr_warmup=0.1`), and converts each value to its type; then every part's check() runs.
    init = plain.get("init")
    name = init.get("name") if isinstance(init, dict) else None
    if name not in INIT_SCHEMAS:
        raise ConfigError(f"init.name: {name!r} has no options schema; known: {', '.join(sorted(INIT_SCHEMAS))}")
    data = plain.get("data")
    schema = _schema(schema_type, INIT_SCHEMAS[name], data_schema(data.get("name") if isinstance(data, dict) else None))
    try:
        cfg = OmegaConf.to_object(OmegaConf.merge(schema, plain))  # merge copies the schema: it stays as built
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        reason = str(e).splitlines()[0]
        raise ConfigError(f"{key}: {reason}" if key else reason) from None
    assert isinstance(cfg, TrainConfig)
    cfg.check(dataset_required)
    return cfg


_SCHEMAS: dict[tuple[type, type, type], DictConfig] = {}


def _schema(schema_type: type[TrainConfig], init_schema: type, data_schema: type) -> DictConfig:
    """The structured config of `schema_type` with the given init and data schemas, built once per process."""
    key = (schema_type, init_schema, data_schema)
    if key not in _SCHEMAS:
        schema = OmegaConf.structured(schema_type)
        schema.init = OmegaConf.structured(init_schema)
        schema.data = OmegaConf.structured(data_schema)
        _SCHEMAS[key] = schema
    return _SCHEMAS[key]


def plain_config(cfg: TrainConfig) -> dict[str, Any]:
    """The plain form of a typed config (enums as their names), as resolved_config.yaml and wandb hold it."""
    plain = OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True)
    assert isinstance(plain, dict)
    return {str(k): v for k, v in plain.items()}


def add_data_schema(schema: type[DataConfig]) -> None:
    """Adds a source's schema under its default `name`, stored as `data/base_<name>` for its option file's defaults
    list (conf/data/<name>.yaml: `defaults: [base_<name>]`)."""
    name = schema.name
    assert isinstance(name, str), f"{schema.__name__} gives no default name"
    DATA_SCHEMAS[name] = schema
    ConfigStore.instance().store(group="data", name=f"base_{name}", node=schema)
