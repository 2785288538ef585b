"""The first seconds of a device call: install the carried wheels the machine lacks, then check everything
the call relies on, and stop with one clear message if anything is missing (scripts/device/plan.sh).

A wheel is a zip archive; extracting it into `SITE` (put first on PYTHONPATH by plan.sh) installs it
without pip or an index. A wheel is installed only where its distribution is absent, except the
transformers group, which replaces an image's transformers older than `MIN_TRANSFORMERS`. With `--cpu` (the
rehearsal) only wheels this interpreter can load are considered, and no GPU is required.

Call 2 also measures GPU physics (MJX in `embodied bench envs`): its imports (`PHYSICS`) and JAX's GPU are
checked apart from the rest. Where they fail, the exit status is 4 instead of 3 and the report says why
in `physics`: plan.sh then still runs TRL's measurement and skips the physics one.

Usage: python scripts/device/preflight.py call1|call2 [--cpu] --out FILE.json
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import platform
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WHEELS = ROOT / "runs" / "device" / "wheels"
SITE = Path(os.environ.get("DEVICE_SITE", ROOT / "runs" / "device" / "site"))
MIN_TRANSFORMERS = (5, 20)
TRANSFORMERS_GROUP = ("transformers", "huggingface_hub", "tokenizers", "safetensors", "regex")
"""transformers and the versions it checks at import: installed together or not at all."""
BASE = ["torch", "transformers", "omegaconf", "mujoco", "torchvision", "psutil", "PIL", "yaml"]
MODULES = {
    "call1": [*BASE, "embodied.run", "embodied.bench.step"],
    "call2": [*BASE, "trl", "datasets", "pyarrow", "embodied.run", "embodied.bench.step"],
    "extra": ["torch", "torchvision"],
}
"""What each call imports (call 2 also relies on call 1's installs, still on a warm machine; `extra` only
installs torchvision where the image lacks it)."""
PHYSICS = {"call2": ["jax", "mujoco.mjx", "embodied.bench.envs"]}
"""What a call's physics part imports (MJX: the image's JAX, call 1's mujoco, the carried mujoco-mjx)."""


def fail(message: str) -> None:
    print(f"preflight: FAILED: {message}", file=sys.stderr, flush=True)
    sys.exit(3)


def dist_of(wheel: Path) -> str:
    return wheel.name.split("-")[0].lower().replace("-", "_")


def version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("+")[0].split(".")[:2] if x.isdigit())


def installed(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def loadable(wheel: Path) -> bool:
    """Whether this interpreter can load `wheel` (its tags; no `packaging`: parse the file name)."""
    py, abi, plat = wheel.stem.split("-")[-3:]
    here = f"cp{sys.version_info.major}{sys.version_info.minor}"
    py_ok = any(
        p in ("py3", here, f"py{sys.version_info.major}{sys.version_info.minor}") for p in py.split(".")
    )
    abi_ok = abi in ("none", here) or (abi == "abi3" and py.startswith("cp3"))
    plat_ok = plat == "any" or platform.machine() in plat
    return (py_ok or abi == "abi3") and abi_ok and plat_ok


def to_install(calls: list[str], cpu: bool) -> list[Path]:
    """The carried wheels of `calls` (and of `extra` where it was carried) whose distribution this machine
    lacks (module docstring)."""
    folders = [*calls, *(["extra"] if "extra" not in calls else [])]
    wheels = [w for c in folders for w in sorted((WHEELS / c).glob("*.whl"))]
    if cpu:
        wheels = [w for w in wheels if loadable(w)]
    old = installed("transformers")
    replace_group = old is None or version_tuple(old) < MIN_TRANSFORMERS
    out = []
    for w in wheels:
        d = dist_of(w)
        if d in TRANSFORMERS_GROUP:
            if replace_group:
                out.append(w)
        elif installed(d) is None and installed(d.replace("_", "-")) is None:
            out.append(w)
    return out


def check(modules: list[str], cpu: bool) -> dict:
    """Import `modules` in a fresh interpreter (with SITE first) and report versions and the device."""
    code = (
        "import importlib, json, sys, torch\n"
        f"mods = {modules!r}\n"
        "out = {'python': sys.version.split()[0], 'missing': {}, 'versions': {}}\n"
        "for m in mods:\n"
        "    try:\n"
        "        out['versions'][m] = getattr(importlib.import_module(m), '__version__', 'present')\n"
        "    except Exception as e:\n"
        "        out['missing'][m] = f'{type(e).__name__}: {e}'[:300]\n"
        "out['cuda'] = torch.cuda.is_available()\n"
        "out['gpu'] = torch.cuda.get_device_name(0) if out['cuda'] else None\n"
        "if 'jax' in mods:\n"
        "    try:\n"
        "        import jax\n"
        "        out['jax_devices'] = [f'{d.platform}: {d.device_kind}' for d in jax.devices()]\n"
        "    except Exception as e:\n"
        "        out['jax_devices'], out['jax_error'] = [], f'{type(e).__name__}: {e}'[:300]\n"
        "print(json.dumps(out))\n"
    )
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(SITE), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        XLA_PYTHON_CLIENT_PREALLOCATE="false",  # JAX would take 75% of the GPU in this check otherwise
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode != 0:
        fail(f"the import check itself failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def physics_check(report: dict, modules: list[str], cpu: bool) -> dict:
    """Whether the physics part can run: its imports, and (on the device) a GPU that JAX sees."""
    missing = {m: e for m, e in report["missing"].items() if m in modules}
    devices = report.get("jax_devices", [])
    reason = ""
    if missing:
        reason = (
            f"missing {sorted(missing)}: MJX needs the image's JAX, call 1's mujoco (run call 1 first on the "
            f"same warm machine) and the carried mujoco-mjx and trimesh (runs/device/wheels/call2): {missing}"
        )
    elif not cpu and not any(d.startswith(("gpu", "cuda")) for d in devices):
        reason = f"JAX sees no GPU (devices {devices}; {report.get('jax_error', 'no error')})"
    return {"ok": not reason, "reason": reason, "missing": missing, "jax_devices": devices}


def hint(missing: dict, call: str) -> str:
    """The way out of a failed import check, in words."""
    if "torchvision" in missing:
        return (
            " (the image lacks torchvision: run `bash scripts/device/plan.sh extra` with carry "
            "[runs/device/wheels/extra], then this call again on the same warm machine)"
        )
    if call == "call2":
        return " (call 2 needs call 1's installs: run call 1 first, then call 2 on the same warm machine)"
    return ""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("call", choices=sorted(MODULES))
    ap.add_argument("--cpu", action="store_true", help="the rehearsal: no GPU, only loadable wheels")
    ap.add_argument("--out", required=True, help="where the report JSON goes")
    args = ap.parse_args()
    if not args.cpu and sys.version_info[:2] != (3, 12):
        fail(f"Python {platform.python_version()}: the carried wheels are for the device image's 3.12")
    if not (WHEELS / args.call).is_dir():
        fail(
            f"no {WHEELS / args.call}: run scripts/device/fetch_wheels.sh here and name "
            f"runs/device/wheels/{args.call} in the call's carry"
        )
    SITE.mkdir(parents=True, exist_ok=True)
    todo = to_install([args.call], args.cpu)
    for w in todo:
        with zipfile.ZipFile(w) as z:
            z.extractall(SITE)
    physics = PHYSICS.get(args.call, [])
    report = check(MODULES[args.call] + physics, args.cpu)
    report |= {"call": args.call, "cpu": args.cpu, "installed": [w.name for w in todo], "site": str(SITE)}
    if physics:
        report["physics"] = physics_check(report, physics, args.cpu)
    report["missing"] = {m: e for m, e in report["missing"].items() if m not in physics}
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2), flush=True)
    if report["missing"]:
        fail(f"missing {sorted(report['missing'])}{hint(report['missing'], args.call)}: {report['missing']}")
    if not args.cpu and not report["cuda"]:
        fail("torch sees no CUDA device")
    tf = report["versions"].get("transformers")
    if tf is not None and version_tuple(tf) < MIN_TRANSFORMERS:
        fail(f"transformers {tf} < 5.20 after installing the carried one")
    if physics and not report["physics"]["ok"]:
        print(f"preflight: physics cannot run: {report['physics']['reason']}", file=sys.stderr, flush=True)
        sys.exit(4)
    print(f"preflight: ok ({args.call}, installed {len(todo)} wheels)", flush=True)


if __name__ == "__main__":
    main()
