"""The names of the files a run folder and a sweep folder hold: one place for every writer and reader
(the trainer, tracking, plots, the sweep driver and the CLI)."""

HISTORY_FILE = "history.json"  # per-epoch metrics of a run
STEPS_FILE = "steps.jsonl"  # one line per logged step, written by raydist.train.tracking.TrackingHook
PLOTS_DIR = "plots"  # PNGs of a run or a sweep
LOG_FILE = "raydist.log"  # Ray's own output for a run or a sweep
STOP_FILE = "stop-requested"  # written by the driver on SIGINT/SIGTERM: the workers stop at a step boundary
SWEEP_FILE = "raydist_sweep.yaml"  # a sweep's space + base config + data folder: what `--resume` needs
BEST_CONFIG_FILE = "best_config.yaml"  # a sweep's best trial as a preset
BEST_CHECKPOINT_FILE = "best_checkpoint.json"  # a run's best checkpoint and the val metric that chose it
