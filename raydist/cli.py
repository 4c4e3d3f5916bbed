"""``raydist`` command line: parses arguments and calls library functions (no logic lives here)."""

from __future__ import annotations

import time

STARTED = time.time()  # before the other imports: the CLI's start, for "first optimizer step after …"

import argparse
import dataclasses
import json
import shlex
import sys
from pathlib import Path

from raydist.config import (
    ConfigError,
    chosen_preset,
    dump_yaml,
    parse_overrides,
    preset_names,
    run_overrides,
)
from raydist.console import configure_console


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", help="dataset folder (default: the embedded synthetic dataset, cached)")
    p.add_argument(
        "--preset",
        help=f"shipped preset: {', '.join(preset_names())} (default: with --data, the one "
        "the dataset's size and captions pick, said in one line; else default)",
    )
    p.add_argument("--preset-file", help="a preset YAML file (e.g. the best config a Tune sweep wrote)")
    p.add_argument("--storage", help="train.storage_path: local folder, or s3:// gs:// NFS on clusters")
    p.add_argument(
        "--storage-shared",
        action="store_true",
        help="train.storage_shared: the local --storage folder is mounted on every node (NFS), so a "
        "multi-node cluster may use it",
    )
    p.add_argument(
        "--name",
        help="train.run_name: an existing run of this name continues if it is unfinished "
        "and has the same config",
    )
    p.add_argument("--address", help="join this Ray cluster (default: RAY_ADDRESS, else a private local Ray)")
    p.add_argument(
        "overrides", nargs="*", metavar="key=value", help="dotted config overrides, e.g. loss.margin=0.1"
    )


def preset_from_args(args: argparse.Namespace) -> str | None:
    """``--preset``; none for ``--preset-file`` alone; with ``--data`` and neither, the preset the dataset's
    shape picks (one line says which and why: on stderr under ``--print-config``); else the default."""
    from raydist.recipe import data_preset

    name, line = data_preset(args.data, args.preset, args.preset_file)
    if line:
        print(line, file=sys.stderr if getattr(args, "print_config", False) else sys.stdout)
    return name


def config_from_args(args: argparse.Namespace):
    """The run Config an argparse namespace describes (:func:`raydist.recipe.run_recipe`: preset, preset file,
    the image rules that follow from --data, overrides); the lines saying what was chosen are printed (on
    stderr under ``--print-config``)."""
    from raydist.recipe import run_recipe

    overrides = run_overrides(
        args.overrides,
        data=args.data,
        storage=args.storage,
        name=args.name,
        storage_shared=args.storage_shared,
    )
    recipe = run_recipe(args.data, preset=args.preset, preset_file=args.preset_file, overrides=overrides)
    for line in recipe.lines:
        print(line, file=sys.stderr if getattr(args, "print_config", False) else sys.stdout)
    return recipe.config


def resume_config_from_args(args: argparse.Namespace):
    """``--resume``: the checkpoint's own config with this command line's overrides (architecture keys
    refused); prints what changed."""
    from raydist.checkpoint import format_changes, resumed_config

    if args.preset or args.preset_file:
        raise ConfigError("--resume continues with the checkpoint's config: drop --preset/--preset-file")
    overrides = run_overrides(args.overrides, data=args.data, storage_shared=args.storage_shared)
    cfg, changes = resumed_config(args.resume, overrides)
    print(f"resuming with the checkpoint's config; {format_changes(changes)}")
    return cfg


def cmd_train(args: argparse.Namespace) -> int:
    from raydist.eval.metrics import format_metrics
    from raydist.train.trainer import format_history, format_startup, run_training

    imported = time.time()
    if args.budget is not None and not args.auto:
        raise ConfigError("--budget is the --auto search's minutes: add --auto")
    if args.auto and (args.resume or args.print_config):
        raise ConfigError("--auto searches, then starts a new run: drop --resume/--print-config")
    cfg = resume_config_from_args(args) if args.resume else config_from_args(args)
    if args.print_config:
        print(dump_yaml(cfg))
        return 0
    if args.auto:
        from raydist.tune.auto import DEFAULT_BUDGET_MIN, auto_search

        budget = DEFAULT_BUDGET_MIN if args.budget is None else args.budget
        cfg = auto_search(
            cfg, fixed=parse_overrides(args.overrides), budget_min=budget, address=args.address
        ).config
    outcome = run_training(cfg, resume_from=args.resume, address=args.address, force=args.force)
    if outcome.stopped:
        resume = f"raydist train --resume {shlex.quote(str(outcome.latest_checkpoint))}"
        print(f"\nstopped on request; run folder: {outcome.run_dir}")
        print(f"checkpoint:        {outcome.latest_checkpoint}")
        print(
            f"resume with:       {resume}"
            + (f" --address {shlex.quote(args.address)}" if args.address else "")
        )
        return 130
    if outcome.first_step_unix is not None:
        print(
            f"[raydist] first optimizer step {outcome.first_step_unix - STARTED:.1f} s after `raydist` started "
            "(Python's own start-up not counted)"
        )
        outcome.startup = {
            "launch": STARTED,
            "imports": imported,
            **outcome.startup,
            "first_step": outcome.first_step_unix,
        }
        print(f"[raydist] start-up: {format_startup(outcome.startup, STARTED)} after `raydist` started")
    print("\n== per-epoch metrics ==")
    print(format_history(outcome.history, outcome.columns))
    if outcome.resumed_at:
        print(f"resumed from a checkpoint at step {', '.join(map(str, outcome.resumed_at))}")
    if outcome.test_metrics:
        print("\n== test split, best checkpoint ==")
        print(format_metrics(outcome.test_metrics))
    print(f"\nrun folder:        {outcome.run_dir}")
    print(f"dataset:           {outcome.data_dir}")
    print(f"best checkpoint:   {outcome.best_checkpoint}")
    print(f"latest checkpoint: {outcome.latest_checkpoint}")
    if outcome.best_checkpoint:
        print(f"evaluate with:     raydist eval --checkpoint {outcome.best_checkpoint} --split test")
    if args.json:
        Path(args.json).write_text(json.dumps(vars(outcome), indent=2, default=str))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from raydist.eval.metrics import format_metrics
    from raydist.inference import choose_checkpoint, evaluate_checkpoint

    chosen = choose_checkpoint(args.checkpoint, latest=args.latest)
    metrics = evaluate_checkpoint(chosen.path, args.data, args.split, folds=args.folds)
    print(f"{args.split} split, checkpoint {chosen}" + (f", {args.folds} folds" if args.folds else ""))
    print(format_metrics(metrics))
    if args.json:
        Path(args.json).write_text(json.dumps(metrics, indent=2))
        print(f"metrics written to {args.json}")
    return 0


def _dims(text: str | None) -> list[int] | None:
    """``8,16,32`` → [8, 16, 32]."""
    if not text:
        return None
    try:
        return [int(d) for d in text.split(",")]
    except ValueError as e:
        raise ValueError(f"--dims: expected comma-separated integers, got {text!r}") from e


def cmd_plot(args: argparse.Namespace) -> int:
    from raydist.plots import plot_folder

    files = plot_folder(args.run, args.metric, out_dir=args.out)
    for path in files:
        print(f"wrote {path}")
    return 0 if files else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from raydist.benchmarks import append_results, recorded_command, run_benchmarks

    table = run_benchmarks(
        args.names or None,
        smoke=args.smoke,
        repeats=args.repeats,
        options={"data": args.data, "in_process": args.in_process},
    )
    if args.record:
        append_results(args.record, recorded_command(["raydist", "bench", *sys.argv[2:]]), table)
        print(f"appended to {args.record}")
    return 0


def cmd_experiment(args: argparse.Namespace) -> int:
    from raydist.experiments import run_experiment

    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
    result = run_experiment(
        args.name,
        quick=args.quick,
        seeds=seeds,
        data=args.data,
        out_dir=args.out,
        preset=args.preset,
        overrides=parse_overrides(args.overrides),
        storage=args.storage,
        address=args.address,
    )
    for key, value in result.items():
        if isinstance(value, (str, Path)):
            print(f"{key + ':':18} {value}")
    return 0


def cmd_index(args: argparse.Namespace) -> int:
    from raydist.inference import choose_checkpoint, write_checkpoint_indexes

    chosen = choose_checkpoint(args.checkpoint, latest=args.latest)
    print(f"checkpoint {chosen}")
    rset, dims = write_checkpoint_indexes(
        chosen.path,
        args.out,
        args.data,
        split=args.split,
        dims=_dims(args.dims),
        kind=args.kind,
        hnsw_m=args.hnsw_m,
    )
    print(
        f"wrote {args.kind} indexes at dims {dims} of {rset.database.shape[0]} vectors ({rset.split}) to {args.out}"
    )
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    from raydist.inference import read_queries, search_index

    if (args.query is None) == (args.queries is None):
        raise ValueError("give one of --query TEXT or --queries FILE")
    queries = [args.query] if args.query is not None else read_queries(args.queries)
    result = search_index(args.index, queries, k=args.k, dim=args.dim, checkpoint=args.checkpoint)
    meta = result.meta
    print(
        f"index {args.index}: {len(meta['database_ids'])} {meta['task']} vectors of {meta['split']}, dim {result.dim}; "
        f"queries embedded by {result.checkpoint.path}"
    )
    for q, (ids, scores) in enumerate(zip(result.ids, result.scores)):
        print(f"query {q}: {queries[q]!r}" if isinstance(queries, list) else f"query {q}")
        for rank, (i, score) in enumerate(zip(ids, scores), 1):
            print(f"  {rank:>3}  id {int(i):>10}  score {float(score):.4f}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from raydist.serving.deployment import serve_until_stopped
    from raydist.serving.service import ServeOptions

    options = ServeOptions(
        max_items=args.max_items,
        max_body_bytes=round(args.max_body_mb * 2**20),
        max_batch=args.max_batch,
        batch_wait_s=args.batch_wait_ms / 1e3,
        shortlist=args.shortlist,
    )
    return serve_until_stopped(
        checkpoint=args.checkpoint,
        index=args.index,
        data_dir=args.data,
        latest=args.latest,
        host=args.host,
        port=args.port,
        replicas=args.replicas,
        replica_cpus=args.replica_cpus,
        options=options,
        address=args.address,
        log_level="INFO" if args.verbose else "WARNING",
    )


def cmd_retrieve(args: argparse.Namespace) -> int:
    from raydist.inference import checkpoint_retrieval_report, choose_checkpoint

    chosen = choose_checkpoint(args.checkpoint, latest=args.latest)
    print(f"checkpoint {chosen}")
    funnel = None
    if args.funnel:
        stages, _, sizes = args.funnel.partition(":")
        funnel = (_dims(stages), _dims(sizes))
    report = checkpoint_retrieval_report(
        chosen.path,
        args.data,
        split=args.split,
        dims=_dims(args.dims),
        kind=args.kind,
        baseline_checkpoint=args.baseline,
        out_dir=args.out,
        shortlist=args.shortlist,
        funnel=funnel,
        k=args.k,
    )
    print(report["table"])
    for path in report["files"]:
        print(f"wrote {Path(args.out) / path}")
    return 0


def _wrote(out: str | Path, started: float) -> None:
    """``wrote dataset OUT in 2.1 s`` and what it holds (:func:`raydist.data.summary.dataset_summary`)."""
    from raydist.data.summary import dataset_summary

    print(f"wrote dataset {out} in {time.perf_counter() - started:.1f} s")
    print("\n".join(dataset_summary(out)))


def cmd_make_data(args: argparse.Namespace) -> int:
    from raydist.data import ensure_default_dataset, make_synthetic
    from raydist.data.synthetic_labels import make_synthetic_labels

    started = time.perf_counter()
    if args.kind is None:  # the embedded default dataset (what `raydist train` uses with no --data)
        if args.out:
            raise ValueError(
                "make-data: --out goes with a kind (synthetic, synthetic-labels); without one the "
                "embedded dataset is made in the cache (`raydist data path` prints where)"
            )
        from raydist.data.summary import dataset_summary

        folder = ensure_default_dataset()
        print(f"embedded dataset: {folder} (the default of `raydist train`, cached)")
        print("\n".join(dataset_summary(folder)))
        return 0
    if not args.out:
        raise ValueError(f"make-data {args.kind}: give --out DIR")
    if args.kind == "synthetic-labels":
        out = make_synthetic_labels(
            args.out,
            classes=args.classes,
            train_per_class=args.train_per_class,
            val_per_class=args.val_per_class,
            test_per_class=args.test_per_class,
            dim=args.dim or 32,
            overlap=args.overlap,
            duplicates=args.duplicates,
            seed=args.seed,
            overwrite=args.overwrite,
        )
        _wrote(out, started)
        return 0
    out = make_synthetic(
        args.out,
        images=args.images,
        captions_per_image=args.captions_per_image,
        dim=args.dim or 128,
        seed=args.seed,
        val_images=args.val_images,
        test_images=args.test_images,
        overwrite=args.overwrite,
    )
    _wrote(out, started)
    return 0


def _split_pairs(text: str | None) -> list[tuple[str, str]] | None:
    """``train=train,val=dev,test=testall`` → ``[(raydist split, source name), ...]``."""
    if not text:
        return None
    pairs = [item.partition("=") for item in text.split(",")]
    bad = [a + b + c for a, b, c in pairs if not b or a not in ("train", "val", "test")]
    if bad:
        raise ValueError(f"--splits: expected train=NAME,val=NAME,test=NAME, got {', '.join(bad)}")
    return [(a, c) for a, _, c in pairs]


def cmd_corrupt_labels(args: argparse.Namespace) -> int:
    from raydist.data.labels_io import corrupt_labels

    started = time.perf_counter()
    out = corrupt_labels(args.src, args.out, p=args.p, seed=args.seed, overwrite=args.overwrite)
    print(f"train labels flipped with p={args.p}, seed {args.seed}; clean labels kept")
    _wrote(out, started)
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from raydist.data import convert_coco_json, convert_vsepp_precomp
    from raydist.data.convert_images import convert_coco_images, convert_image_folder, convert_karpathy
    from raydist.data.labels_io import convert_npz

    needs = {
        "karpathy": ("src", "images"),
        "coco-json": ("captions",),
        "image-folder": ("src",),
        "npz": ("src",),
        "vsepp-precomp": ("src",),
    }
    missing = [f"--{name}" for name in needs[args.format] if not getattr(args, name)]
    if missing:
        raise ValueError(f"convert {args.format}: give {' and '.join(missing)}")
    if args.format == "coco-json" and bool(args.images) == bool(args.features or args.feature_ids):
        raise ValueError("convert coco-json: give either --images DIR or --features and --feature-ids")
    split_pairs = _split_pairs(args.splits)
    started = time.perf_counter()
    if args.format == "karpathy":
        out = convert_karpathy(
            args.src, args.images, args.out, min_count=args.min_count, overwrite=args.overwrite
        )
    elif args.format == "image-folder":
        out = convert_image_folder(
            args.src,
            args.out,
            split_by=args.split_by,
            val_fraction=args.val_fraction,
            test_fraction=args.test_fraction,
            seed=args.seed,
            overwrite=args.overwrite,
        )
    elif args.format == "coco-json" and args.images:
        out = convert_coco_images(
            args.captions,
            args.images,
            args.out,
            min_count=args.min_count,
            val_images=args.val_images,
            test_images=args.test_images,
            split_map={src: dst for dst, src in split_pairs} if split_pairs else None,
            overwrite=args.overwrite,
        )
    elif args.format == "npz":
        out = convert_npz(
            args.src,
            args.out,
            val_fraction=args.val_fraction,
            test_fraction=args.test_fraction,
            seed=args.seed,
            overwrite=args.overwrite,
            standardize=args.standardize,
        )
    elif args.format == "vsepp-precomp":
        out = convert_vsepp_precomp(
            args.src,
            args.out,
            captions_per_image=args.captions_per_image,
            min_count=args.min_count,
            splits=dict(split_pairs) if split_pairs else None,
            overwrite=args.overwrite,
        )
    else:
        out = convert_coco_json(
            args.captions,
            args.features,
            args.feature_ids,
            args.out,
            min_count=args.min_count,
            val_images=args.val_images,
            test_images=args.test_images,
            split_map={src: dst for dst, src in split_pairs} if split_pairs else None,
            overwrite=args.overwrite,
        )
    _wrote(out, started)
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from raydist.data import ensure_default_dataset
    from raydist.data.summary import dataset_summary

    if args.action == "path":
        print(ensure_default_dataset())
        return 0
    folder = args.dir or ensure_default_dataset()
    print(folder)
    print("\n".join(dataset_summary(folder)))
    return 0


def cmd_embed(args: argparse.Namespace) -> int:
    from raydist.data import load_manifest
    from raydist.extract import checkpoint_encoder, extract_features, pretrained_encoder

    if (args.checkpoint is None) == (args.image_encoder is None):
        raise ValueError(
            "give one of --checkpoint RUN (a trained image encoder) or --image-encoder NAME "
            "(a pretrained, not fine-tuned one)"
        )
    if args.checkpoint is not None:
        if args.image_weights or args.image_size:
            raise ValueError("--image-weights/--image-size go with --image-encoder; a checkpoint has its own")
        encoder = checkpoint_encoder(args.checkpoint, args.data, output=args.output, latest=args.latest)
        print(
            f"[raydist] embed: the image encoder of checkpoint {encoder.source['checkpoint']} ({args.output})"
        )
    else:
        if args.output != "backbone":
            raise ValueError(
                "--output head needs --checkpoint: a pretrained encoder's projection head is untrained"
            )
        encoder = pretrained_encoder(
            args.image_encoder,
            load_manifest(args.data),
            weights=args.image_weights,
            image_size=args.image_size,
        )
        print(
            f"[raydist] embed: {args.image_encoder} backbone, weights "
            f"{args.image_weights or 'as initialised (no --image-weights)'}"
        )
    manifest = extract_features(
        args.data, args.out, encoder, batch_size=args.batch_size, overwrite=args.overwrite
    )
    rows = ", ".join(f"{s} {info.rows}" for s, info in manifest.splits.items())
    print(f"wrote {args.out}: task {manifest.task}, {manifest.feature_dim}-d features, rows {rows}")
    print(f"train on it with:  raydist train --data {args.out}")
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    from raydist.data import ensure_default_dataset
    from raydist.train.preset_table import preset_table

    print(preset_table(Path(args.data) if args.data else ensure_default_dataset()))
    return 0


def cmd_ray_ports(args: argparse.Namespace) -> int:
    from raydist.runtime import ray_start_flags

    print(" ".join(ray_start_flags(args.dashboard_port)))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from raydist.data import validate_dataset
    from raydist.data.remote import local_dataset
    from raydist.tasks import task_names

    # a URI: its local copy; a WebDataset folder: its index (whose build refuses bad samples by shard and key)
    folder = local_dataset(args.dir)
    report = validate_dataset(folder, tasks=task_names(), image_sample=args.image_sample)
    print(report.format())
    return 1 if report.problems else 0


def cmd_tokenizer(args: argparse.Namespace) -> int:
    from raydist.data.tokenizer import set_dataset_tokenizer, train_captions, train_tokenizer

    if args.action == "train":
        if not args.vocab_size:
            raise ValueError("tokenizer train: give --vocab-size N")
        out = Path(args.out)
        if out.exists() and not args.overwrite:
            raise ValueError(f"tokenizer train: {out} exists; give another --out or --overwrite")
        tokenizer = train_tokenizer(train_captions(args.data), args.vocab_size, args.kind)
        tokenizer.save(out)
        print(
            f"trained a {args.kind} tokenizer on the train captions of {args.data}: {len(tokenizer)} tokens, "
            f"saved as {out}; to train with it: raydist tokenizer set --data {args.data} --tokenizer {out}"
        )
        return 0
    else:
        if not args.tokenizer:
            raise ValueError("tokenizer set: give --tokenizer FILE (a tokenizer.json)")
        tokenizer = set_dataset_tokenizer(args.data, args.tokenizer)
        done = f"copied {args.tokenizer}"
    print(f"{done}: {len(tokenizer)} tokens, saved as {Path(args.data) / 'tokenizer.json'}")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from raydist.tune import load_space, resolve_base_config

    started = args.space or args.overrides or args.preset or args.preset_file or args.data or args.num_samples
    if args.resume and started:
        raise ConfigError("--resume continues a sweep as it was started: drop the other arguments")
    if not args.resume and not args.space:
        raise ConfigError(
            "give a space file or a shipped space's name (e.g. margin) or --resume EXPERIMENT_FOLDER"
        )
    from raydist.tune.sweep import format_results, resume_sweep, run_sweep

    if args.resume:
        outcome = resume_sweep(args.resume, resume_errored=args.resume_errored, address=args.address)
    else:
        space = load_space(args.space)
        if args.num_samples:
            space = dataclasses.replace(space, num_samples=args.num_samples)
        overrides = run_overrides(args.overrides, data=args.data, storage_shared=args.storage_shared)
        cfg = resolve_base_config(
            space,
            preset=chosen_preset(args.preset, args.preset_file),
            preset_file=args.preset_file,
            overrides=overrides,
        )
        outcome = run_sweep(space, cfg, storage_path=args.storage, address=args.address)
    print("\n== sweep results ==")
    print(format_results(outcome))
    print(f"\nexperiment folder: {outcome.experiment_path}")
    print(f"best config:       {outcome.best_config_path}  (raydist train --preset-file FILE)")
    print(f"best checkpoint:   {outcome.best_checkpoint}")
    print(f"resume with:       raydist tune --resume {outcome.experiment_path}")
    return 0 if outcome.best_config_path else 1


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("raydist")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The ``raydist`` argument parser with all sub-commands."""
    parser = argparse.ArgumentParser(
        prog="raydist",
        description="Ray-native distributed training of retrieval embeddings (image–caption pairs and "
        "class-labelled vectors): data, training, evaluation, retrieval and sweeps.",
    )
    parser.add_argument("--version", action="version", version=f"raydist {_version()}")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also show Ray's own logs and worker output (always in the run's raydist.log)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train with Ray Train (default: short run on the embedded dataset)")
    _add_config_args(p)
    p.add_argument("--resume", help="checkpoint folder (or run folder) to resume from")
    p.add_argument("--json", help="also write the outcome (history, checkpoints, test metrics) as JSON")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument(
        "--force",
        action="store_true",
        help="--name of an existing run: delete that run folder and start the run over",
    )
    p.add_argument(
        "--auto",
        action="store_true",
        help="first search lr, crops, flips, the small CNN's width and "
        "grid, MH/SH with short Tune trials (ASHA, the defaults first), then train the winner; keys set "
        "as key=value stay fixed",
    )
    p.add_argument("--budget", type=float, metavar="MIN", help="--auto: minutes of search (default 5)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="evaluate a checkpoint with the VSE++ retrieval protocol")
    p.add_argument(
        "--checkpoint", required=True, help="checkpoint folder or run folder (its best checkpoint)"
    )
    p.add_argument(
        "--latest", action="store_true", help="a run folder means its newest checkpoint, not its best"
    )
    p.add_argument("--data", help="dataset folder (default: the dataset the checkpoint was trained on)")
    p.add_argument("--split", default="test", help="split to evaluate: train, val or test")
    p.add_argument(
        "--folds", type=int, default=None, help="5 = COCO 1K protocol (default: checkpoint config)"
    )
    p.add_argument("--json", help="write the metrics to this JSON file")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser(
        "plot",
        help="PNG plots of a run (loss with the SH→MH switch, validation, negatives) "
        "or of a Tune sweep (metric against each searched key)",
    )
    p.add_argument(
        "run", help="a run folder (with history.json / steps.jsonl) or a sweep's experiment folder"
    )
    p.add_argument("--metric", help="sweeps: the metric to plot (default: the space file's)")
    p.add_argument("--out", help="folder for the PNGs (default: RUN/plots)")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("bench", help="run benchmarks side by side with their references (table + ratios)")
    p.add_argument(
        "names",
        nargs="*",
        help="benchmarks to run: loss, loss-memory, data, step, gather, gc, startup, "
        "retrieval, real-cross-view, text-encoders, tokenize, images, pixels-vs-vectors, grad-cache, serve (default: all)",
    )
    p.add_argument("--smoke", action="store_true", help="tiny sizes, one repetition (what the tests run)")
    p.add_argument("--repeats", type=int, default=5, help="repetitions per measurement (median and spread)")
    p.add_argument(
        "--data",
        help="pixels-vs-vectors: an encoded-image dataset folder (task labels or pairs; "
        "default: scikit-learn's digits as PNGs); the other benchmarks ignore it",
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="pixels-vs-vectors: train in process with one torch "
        "thread (train.num_workers=0) instead of the Ray Train workers `raydist train` starts",
    )
    p.add_argument("--record", help="append the table with command, machine and versions to this file")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("experiment", help="run a paper's claim as an experiment: sweep, table, PNG, verdict")
    p.add_argument("name", help="negatives, mh-vs-sh, gather, label-noise, matryoshka or gc-variance")
    p.add_argument("--quick", action="store_true", help="tiny preset, one seed, 1-2 epochs (a smoke run)")
    p.add_argument("--seeds", help="comma-separated seeds (default: the experiment's)")
    p.add_argument(
        "--data",
        help="dataset folder, or a named dataset: synthetic-pairs, digit-halves (pairs); "
        "synthetic, digits, duplicated, no-duplicates (labels) (default: the experiment's own data)",
    )
    p.add_argument("--preset", help="base preset of every trial (default: the experiment's)")
    p.add_argument("--out", help="folder for the table, figures and records")
    p.add_argument("--storage", help="experiment folders' parent: ./runs, or s3:// gs:// NFS on clusters")
    p.add_argument("--address", help="join this Ray cluster (default: RAY_ADDRESS, else a private local Ray)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides every trial shares")
    p.set_defaults(func=cmd_experiment)

    p = sub.add_parser("index", help="build FAISS indexes of a checkpoint's embeddings at nested dims")
    p.add_argument(
        "--checkpoint", required=True, help="checkpoint folder or run folder (its best checkpoint)"
    )
    p.add_argument(
        "--latest", action="store_true", help="a run folder means its newest checkpoint, not its best"
    )
    p.add_argument("--data", help="dataset folder (default: the dataset the checkpoint was trained on)")
    p.add_argument("--split", default="test", help="train, val, test, or all (every split, one index)")
    p.add_argument(
        "--dims", help="comma-separated prefix dims (default: the trained model.nesting, else 8,16,…,D)"
    )
    p.add_argument("--kind", default="flat", choices=["flat", "hnsw"], help="index type (inner product)")
    p.add_argument("--hnsw-m", type=int, default=32, help="HNSW graph degree M")
    p.add_argument("--out", required=True, help="folder for the index files and indexes.json")
    p.set_defaults(func=cmd_index)

    p = sub.add_parser(
        "search", help="search an index built by `raydist index` with texts or feature vectors"
    )
    p.add_argument("--index", required=True, help="folder `raydist index --out` wrote")
    p.add_argument("--query", help="one text query (pairs: a caption; its top-k images)")
    p.add_argument(
        "--queries", help="a file of queries: one text per line, or a .npy of feature vectors [N, D]"
    )
    p.add_argument("--k", type=int, default=10, help="results per query")
    p.add_argument("--dim", type=int, help="search the index at this prefix dim (default: its largest)")
    p.add_argument(
        "--checkpoint", help="embed the queries with this checkpoint (default: the one the index records)"
    )
    p.set_defaults(func=cmd_search)

    p = sub.add_parser(
        "serve",
        help="serve a trained model and its FAISS index over HTTP with Ray Serve: /embed, /search, /health",
    )
    p.add_argument(
        "checkpoint", metavar="RUN_OR_CHECKPOINT", help="run folder (its best checkpoint) or checkpoint"
    )
    p.add_argument(
        "--index",
        default="all",
        help="what /search searches: a split of the checkpoint's dataset (train, val, test), all (default), "
        "or a folder `raydist index` wrote",
    )
    p.add_argument(
        "--data", help="dataset folder of --index SPLIT (default: the one the checkpoint was trained on)"
    )
    p.add_argument(
        "--latest", action="store_true", help="a run folder means its newest checkpoint, not its best"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--replicas", type=int, default=1, help="model replicas (scale out on a cluster)")
    p.add_argument("--replica-cpus", type=float, default=0.5, help="logical CPUs reserved per replica")
    p.add_argument("--max-items", type=int, default=256, help="most inputs in one request")
    p.add_argument("--max-body-mb", type=float, default=8.0, help="largest request body, MiB")
    p.add_argument("--max-batch", type=int, default=16, help="most requests answered in one batch")
    p.add_argument("--batch-wait-ms", type=float, default=5.0, help="longest wait for a batch to fill")
    p.add_argument("--shortlist", type=int, default=200, help="adaptive/funnel search: first shortlist size")
    p.add_argument(
        "--address", help="deploy on this Ray cluster (default: RAY_ADDRESS, else a private local Ray)"
    )
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("retrieve", help="retrieval per dim, adaptive and funnel retrieval, cost, baselines")
    p.add_argument(
        "--checkpoint", required=True, help="checkpoint folder or run folder (its best checkpoint)"
    )
    p.add_argument(
        "--latest", action="store_true", help="a run folder means its newest checkpoint, not its best"
    )
    p.add_argument("--data", help="dataset folder (default: the dataset the checkpoint was trained on)")
    p.add_argument("--split", default="test")
    p.add_argument(
        "--dims", help="comma-separated prefix dims (default: the trained model.nesting, else 8,16,…,D)"
    )
    p.add_argument("--kind", default="flat", choices=["flat", "hnsw", "ivf-prefix"], help="index type")
    p.add_argument("--shortlist", type=int, default=200, help="adaptive retrieval: shortlist size at D_s")
    p.add_argument("--funnel", help="funnel cascade DIMS:SHORTLISTS, e.g. 16,32,64,128:200,100,50")
    p.add_argument("--baseline", help="a non-nested checkpoint: first-m / SVD / random-projection baselines")
    p.add_argument("--k", type=int, default=10, help="neighbours retrieved (P@k, mAP@k for labels)")
    p.add_argument("--out", help="folder for the table, JSON rows and PNG plots")
    p.set_defaults(func=cmd_retrieve)

    p = sub.add_parser(
        "make-data",
        help="write a synthetic dataset: image–caption pairs or labelled vectors (no kind: the embedded "
        "dataset `raydist train` uses, in the cache)",
    )
    p.add_argument("kind", nargs="?", choices=["synthetic", "synthetic-labels"])
    p.add_argument("--out", help="the dataset folder to write (with a kind)")
    p.add_argument("--images", type=int, default=3000, help="synthetic: train images")
    p.add_argument(
        "--val-images", type=int, default=None, help="synthetic: val images (default: images // 6)"
    )
    p.add_argument(
        "--test-images", type=int, default=None, help="synthetic: test images (default: images // 3)"
    )
    p.add_argument("--captions-per-image", type=int, default=5)
    p.add_argument("--dim", type=int, default=None, help="feature dimension (default 128; labels: 32)")
    p.add_argument("--classes", type=int, default=10, help="synthetic-labels: classes K")
    p.add_argument("--train-per-class", type=int, default=100, help="synthetic-labels: train rows per class")
    p.add_argument("--val-per-class", type=int, default=20, help="synthetic-labels: val rows per class")
    p.add_argument("--test-per-class", type=int, default=40, help="synthetic-labels: test rows per class")
    p.add_argument(
        "--overlap",
        type=float,
        default=0.5,
        help="synthetic-labels: class overlap in [0, 1] (shared probability mass of two classes)",
    )
    p.add_argument("--duplicates", type=int, default=1, help="synthetic-labels: copies of each train example")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace an existing dataset folder")
    p.set_defaults(func=cmd_make_data)

    p = sub.add_parser(
        "data", help="`data path`: where the embedded dataset is; `data summary [DIR]`: what a dataset holds"
    )
    p.add_argument("action", choices=["path", "summary"])
    p.add_argument("dir", nargs="?", help="summary: a dataset folder (default: the embedded one)")
    p.set_defaults(func=cmd_data)

    p = sub.add_parser("convert", help="convert a public layout into a raydist dataset")
    p.add_argument("format", choices=["vsepp-precomp", "coco-json", "npz", "karpathy", "image-folder"])
    p.add_argument("--out", required=True)
    p.add_argument(
        "--src",
        help="vsepp-precomp: folder with {split}_ims.npy and {split}_caps.txt; "
        "npz: a .npz file with X (N×D features), y (labels) and optional split; karpathy: "
        "dataset_*.json; image-folder: DIR/<class>/<images> (or DIR/train, DIR/val, DIR/test)",
    )
    p.add_argument(
        "--images",
        help="karpathy: image root (ROOT/filepath/filename); coco-json: image folder "
        "(DIR/file_name), instead of --features/--feature-ids",
    )
    p.add_argument(
        "--split-by",
        choices=["class", "image"],
        default="image",
        help="image-folder without split folders: disjoint classes per split, or stratified by class",
    )
    p.add_argument(
        "--val-fraction",
        type=float,
        default=0.1,
        help="npz without split, image-folder: val share (of each class's rows, or of the classes)",
    )
    p.add_argument(
        "--test-fraction",
        type=float,
        default=0.2,
        help="npz without split, image-folder: test share (of each class's rows, or of the classes)",
    )
    p.add_argument("--seed", type=int, default=0, help="npz without split, image-folder: seed of the split")
    p.add_argument(
        "--standardize",
        action="store_true",
        help="npz: scale each feature to (x - mean) / std with the train split's mean and std (saved "
        "in the dataset as standardization.json, for new query vectors)",
    )
    p.add_argument("--captions", help="coco-json: captions JSON file")
    p.add_argument("--features", help="coco-json: .npy feature matrix, one row per image")
    p.add_argument("--feature-ids", help="coco-json: .npy/.json image id of each feature row")
    p.add_argument("--captions-per-image", type=int, default=5)
    p.add_argument("--min-count", type=int, default=4, help="vocabulary minimum word count (VSE++: 4)")
    p.add_argument("--val-images", type=int, default=5000)
    p.add_argument("--test-images", type=int, default=5000)
    p.add_argument(
        "--splits",
        help="raydist split = source name, e.g. train=train,val=dev,test=testall (vsepp file prefixes; "
        "coco-json: values of the images' 'split' field, a split may repeat: train=train,train=restval)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing dataset folder")
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("corrupt-labels", help="copy a labelled dataset with train labels flipped at rate p")
    p.add_argument("--src", required=True, help="labelled dataset folder")
    p.add_argument("--out", required=True)
    p.add_argument(
        "--p", type=float, required=True, help="flip probability in [0, 1): uniform to another class"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace an existing dataset folder")
    p.set_defaults(func=cmd_corrupt_labels)

    p = sub.add_parser(
        "embed",
        help="an image encoder's outputs over an encoded-image dataset, written as a "
        "precomputed-feature dataset (a trained checkpoint's, or a pretrained one's)",
    )
    p.add_argument("--data", required=True, help="a dataset of encoded images (pairs or labels)")
    p.add_argument("--out", required=True, help="the feature dataset to write")
    p.add_argument(
        "--checkpoint", help="checkpoint folder or run folder (its best checkpoint) of a run on images"
    )
    p.add_argument(
        "--latest", action="store_true", help="a run folder means its newest checkpoint, not its best"
    )
    p.add_argument(
        "--image-encoder",
        help="instead of a checkpoint: an image encoder name (small-cnn, "
        "torchvision:resnet50, timm:…), its backbone's outputs",
    )
    p.add_argument(
        "--image-weights", help="with --image-encoder: the backbone's weights (a local state-dict file)"
    )
    p.add_argument(
        "--image-size",
        type=int,
        help="with --image-encoder: the crop side (default: the median image's shorter side, at most 224)",
    )
    p.add_argument(
        "--output",
        choices=["backbone", "head"],
        default="backbone",
        help="backbone: the features before the projection head (default; the VSE++ precomp route); "
        "head: the trained projection's output, before normalisation (with --checkpoint)",
    )
    p.add_argument("--batch-size", type=int, default=128, help="images per forward pass")
    p.add_argument("--overwrite", action="store_true", help="replace an existing dataset at --out")
    p.set_defaults(func=cmd_embed)

    p = sub.add_parser(
        "presets", help="the shipped presets: what each is for, its steps and its measured time"
    )
    p.add_argument("--data", help="a dataset to resolve each schedule on (default: the embedded one)")
    p.set_defaults(func=cmd_presets)

    p = sub.add_parser(
        "ray-ports",
        help="`ray start` flags with a free port for every listener of a Ray node and its own temp dir, for a "
        "head beside another Ray on this machine: ray start --head $(raydist ray-ports)",
    )
    p.add_argument(
        "--dashboard-port", type=int, help="the dashboard and job server port (default: a free one)"
    )
    p.set_defaults(func=cmd_ray_ports)

    p = sub.add_parser("validate", help="run every data check without training and print a summary")
    p.add_argument("dir")
    p.add_argument(
        "--image-sample",
        type=int,
        metavar="N",
        help="encoded images: decode N per split, drawn with a fixed seed (default: every image)",
    )
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser(
        "tokenizer",
        help="train a subword tokenizer on a dataset's train captions, or set a given "
        "tokenizer.json, as the dataset's tokenizer (model.text_encoder=transformer|hf:PATH use it)",
    )
    p.add_argument("action", choices=["train", "set"])
    p.add_argument("--data", required=True, help="the dataset folder (task pairs)")
    p.add_argument("--vocab-size", type=int, help="train: at most this many tokens")
    p.add_argument(
        "--kind", choices=["wordpiece", "bpe"], default="wordpiece", help="train: the subword model"
    )
    p.add_argument("--tokenizer", help="set: a tokenizer.json file (e.g. a pretrained model folder's)")
    p.add_argument(
        "--out",
        default="tokenizer.json",
        help="train: the file to write (default ./tokenizer.json; the "
        "dataset is not changed until `raydist tokenizer set`)",
    )
    p.add_argument("--overwrite", action="store_true", help="train: replace an existing --out file")
    p.set_defaults(func=cmd_tokenizer)

    p = sub.add_parser("tune", help="Ray Tune sweep: one training run per trial, results table, best config")
    p.add_argument("--data", help="dataset folder (default: the embedded synthetic dataset, cached)")
    p.add_argument("--preset", help=f"trials' base preset: {', '.join(preset_names())} (default: default)")
    p.add_argument("--preset-file", help="a preset YAML file as the base of every trial")
    p.add_argument("--storage", help="experiment folder's parent: ./runs, or s3:// gs:// NFS on clusters")
    p.add_argument(
        "--storage-shared",
        action="store_true",
        help="train.storage_shared: the local --storage folder is mounted on every node (NFS), so a "
        "multi-node cluster may use it",
    )
    p.add_argument("--num-samples", type=int, help="override the space file's num_samples")
    p.add_argument("--resume", metavar="EXPERIMENT_FOLDER", help="continue an interrupted sweep")
    p.add_argument("--resume-errored", action="store_true", help="with --resume: also re-run failed trials")
    p.add_argument("--address", help="join this Ray cluster (default: RAY_ADDRESS, else a private local Ray)")
    p.add_argument("space", nargs="?", help="space file, or a shipped space by name, e.g. margin")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides every trial shares")
    p.set_defaults(func=cmd_tune)
    for command in sub.choices.values():  # every option's help shows its default
        command.formatter_class = DefaultsHelpFormatter
    parser.set_defaults(commands=sub.choices)
    return parser


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Append ``(default: X)`` to an option's help when it has a real default that the help text does not
    already describe (no "(default: None)" or "(default: False)" noise)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            "default" in text
            or action.default in (None, False, argparse.SUPPRESS)
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse a command line; options and ``key=value`` words may come in any order after the command."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    verbose = any(a in ("-v", "--verbose") for a in argv)
    argv = [a for a in argv if a not in ("-v", "--verbose")]
    commands = parser.get_default("commands")
    if argv and argv[0] in commands:
        args = commands[argv[0]].parse_intermixed_args(argv[1:])
    else:
        args = parser.parse_args(argv)  # usage, --help, --version, or the error for an unknown command
    args.verbose = verbose
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``raydist`` console script."""
    args = parse_args(argv)
    configure_console(getattr(args, "verbose", False))
    try:
        return args.func(args)
    except (ConfigError, FileNotFoundError, ValueError) as e:  # bad input: config, data, paths
        print(f"raydist: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # a run that started and failed
        print(f"raydist: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a second Ctrl-C (raydist.train.stopping), or one outside training
        print("raydist: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
