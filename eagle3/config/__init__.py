"""The run config's types: the schemas Hydra composes into, their range checks, and the typed run config.

Every YAML option in `conf/<group>/` starts from one of these schemas (its `defaults: [base_<x>]`), so a
wrong type or an unknown key fails at composition with Hydra's own message. `run_config()` turns the plain,
resolved config (freshly composed, or a run dir's resolved_config.yaml) into a `RunConfig` instance through the
same schemas, refusing keys no schema has (a `+key=` override, an edited file), and runs each part's
`check()` for what a type cannot rule out. Code past the launcher reads attributes (`cfg.optim.lr`) and takes
the part it needs.

One module per part, each importing only those above it here: checks.py (the checks the schemas are written
with: a key's one message, temperatures, paths), model.py (verifier and draft, their flag and shape rules),
data.py (every data source's schema, and the look at a rows file's first bytes), training.py (init, optim,
distributed, logger, eval, on-policy), typed.py (TrainConfig / RunConfig, the ConfigStore, plain <-> typed). This
package re-exports their names: `from eagle3.config import DraftConfig`.

It imports neither torch nor speculators: `launch.py --help` and `--cfg job` go through it.
"""

from eagle3.config.checks import path_kind, require, require_dir, require_temperature
from eagle3.config.data import (
    DATA_SCHEMAS,
    MIN_SEQ_LEN,
    ROWS_FILES,
    BadSamplePolicy,
    DataConfig,
    HiddenStateFiles,
    HiddenStatesDtype,
    OfflineDataConfig,
    OnlineDataConfig,
    RegenerateDataConfig,
    Regeneration,
    RegenerationEngine,
    RowFormat,
    SynthConfig,
    TinyDataConfig,
    TokenRows,
    check_total_seq_len,
    data_schema,
    rows_path_problem,
)
from eagle3.config.model import (
    DFLASH_BLOCK_RANGE,
    EAGLE31_FLAGS,
    FLAGS,
    SIZE_KEYS,
    SPECULATORS_FLAGS,
    AttnImpl,
    DraftConfig,
    DraftKind,
    DraftLoss,
    LayerType,
    ModelConfig,
    TinyVerifierConfig,
    VerifierConfig,
    asked_flags,
    check_aux_layers,
    flag_conflicts,
    kind_flag_problem,
    run_flags,
    shape_problems,
)
from eagle3.config.training import (
    INIT_SCHEMAS,
    AcceptEvalConfig,
    Backend,
    DistributedConfig,
    EvalConfig,
    InitConfig,
    LoggerConfig,
    LoggerMode,
    LoopConfig,
    OnPolicyConfig,
    OptimConfig,
    PretrainedInitConfig,
    Scheduler,
    ScratchInitConfig,
    ServeEvalConfig,
    Strategy,
    VocabPolicy,
    lr_advice,
)
from eagle3.config.typed import (
    Device,
    Objective,
    RunConfig,
    RunInfo,
    TrainConfig,
    add_data_schema,
    plain_config,
    register_configs,
    run_config,
    validate,
)
from eagle3.errors import ConfigError

__all__ = [
    "AcceptEvalConfig", "AttnImpl", "Backend", "BadSamplePolicy", "ConfigError", "DATA_SCHEMAS",
    "DFLASH_BLOCK_RANGE", "DataConfig", "Device", "DistributedConfig", "DraftConfig", "DraftKind", "DraftLoss",
    "EAGLE31_FLAGS", "EvalConfig", "FLAGS", "HiddenStateFiles", "HiddenStatesDtype", "INIT_SCHEMAS", "InitConfig",
    "LayerType", "LoggerConfig", "LoggerMode", "LoopConfig", "MIN_SEQ_LEN", "ModelConfig", "Objective",
    "OfflineDataConfig", "OnPolicyConfig", "OnlineDataConfig", "OptimConfig", "PretrainedInitConfig", "ROWS_FILES",
    "RegenerateDataConfig", "Regeneration", "RegenerationEngine", "RowFormat", "RunConfig", "RunInfo", "SIZE_KEYS",
    "SPECULATORS_FLAGS", "Scheduler", "ScratchInitConfig", "ServeEvalConfig", "Strategy", "SynthConfig",
    "TinyDataConfig", "TinyVerifierConfig", "TokenRows", "TrainConfig", "VerifierConfig", "VocabPolicy",
    "add_data_schema", "asked_flags", "check_aux_layers", "check_total_seq_len", "data_schema", "flag_conflicts",
    "kind_flag_problem", "lr_advice", "path_kind", "plain_config", "register_configs", "require", "require_dir",
    "require_temperature", "rows_path_problem", "run_config", "run_flags", "shape_problems", "validate",
]
