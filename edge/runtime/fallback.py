"""Boot stages of the fallback the circuit breaker serves from (docs/breaker.md): load it and warm
it, so that the first degraded request costs no more than any other.

The package names its fallback (``edge/preload/fallback.py``): a lighter package inside it (the
int8 one), or its own weights on another engine or device. Both stages run after the primary's
(and after a snapshot restore: a CUDA fallback must not touch the device before the checkpoint),
and show in the boot timeline under their own names. ``--fallback off`` skips them.
"""

from __future__ import annotations

from pathlib import Path

from edge.serving.breaker import Fallback

__all__ = ["FALLBACK_SETTING", "load_fallback", "warm_fallback", "boot_fallback"]

FALLBACK_SETTING = "--fallback off, or rebuild the package's fallback (edge-package build --fallback-package DIR)"


def load_fallback(pkg, verify: str):
    """(package, engine) of ``pkg``'s fallback, its files checked as ``verify`` says; None when it
    names none."""
    from edge.engines import load_engine
    from edge.preload.fallback_package import resolve_fallback
    from edge.preload.manifest import open_package

    found = resolve_fallback(pkg)
    if found is None:
        return None
    root, engine_name, device = found
    fpkg = pkg if Path(root) == Path(pkg.root) else open_package(root, verify=verify, engine=engine_name)
    return fpkg, load_engine(fpkg, engine_name, device)


def warm_fallback(engine, shapes, manifest, plan: list[tuple[int, int]] | None = None) -> dict:
    """Every warmed shape of the primary (or those of ``plan``) run once on the fallback (it serves
    the same batches); its own input buffers, returned."""
    from edge import warmup

    buffers = warmup.preallocate(shapes, engine)
    sample = manifest.serving.warm_sample_ids
    if sample is None:
        raise ValueError("the fallback package stores no warm-up sample (serving.warm_sample_ids): rebuild it")
    warmup.warm_buckets(engine, shapes, sample, buffers, plan=plan)
    return buffers


def boot_fallback(stages, args, pkg, shapes) -> Fallback | None:
    """The two stages, as ``stages`` runs them; None when the package names no fallback or
    ``--fallback off``."""
    if getattr(args, "fallback", "auto") == "off":
        return None
    loaded = stages.run(load_fallback, pkg, args.verify, setting=FALLBACK_SETTING)
    if loaded is None:
        return None
    fpkg, engine = loaded
    now, later = _warm_plan(args, shapes, engine)
    buffers = stages.run(warm_fallback, engine, shapes, fpkg.manifest, kwargs={"plan": now}, setting=FALLBACK_SETTING,
                         engine=engine.name, device=engine.device, shapes=len(now),
                         deferred=[f"{r}x{t}" for r, t in later])
    return Fallback(engine, buffers, manifest=fpkg.manifest, warm_later=later)


def _warm_plan(args, shapes, engine) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The primary's rule (``--warm-up``) for the fallback's own device (a CUDA fallback warms
    every shape before READY, a CPU one defers beside a CUDA primary too), and never as part of
    a snapshot: the fallback loads after each restore, so ``auto`` defers there as well."""
    from edge.engines.device import device_kind
    from edge.runtime.engine_chain import warm_plan

    return warm_plan(args, shapes, kind=device_kind(engine.device), in_snapshot=False)
