"""YAML price books: the native effective-dated layout and the seed-003 §6.1 cost-model layout.

Validation is strict: every problem raises PriceBookError naming file, field and value.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from datetime import UTC, date, datetime
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from importlib.resources import files
from pathlib import Path
from typing import Any

from gpumeter.billing.pricing.aliases import NVML_ALIASES
from gpumeter.billing.pricing.base import (
    IDLE_POLICIES,
    SHARING_MODES,
    SHARING_SPLITS,
    SLICE_WEIGHT_POLICIES,
    GpuPrice,
    PriceBook,
    PriceBookError,
    PriceVersion,
)
from gpumeter.billing.pricing.currency import MINOR_UNITS
from gpumeter.billing.pricing.yamlload import YamlRefused, load_yaml

HOURS_PER_MONTH = Decimal(730)  # 8760 / 12
RATE_QUANTUM = Decimal("0.000001")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Package data, found through the package (never a path into a checkout): `gpumeter billing prices default`.
DEFAULT_BOOK = Path(str(files("gpumeter.billing.pricebooks") / "default.yaml"))

# What money can be (docs/billing.md §3.4): every number of a book is bounded, so no later sum or
# column overflows. A rate (given or derived) is at most 10^7 currency units per GPU-hour with 6
# decimals: a month of 100,000 GPUs stays below 10^15, inside the ledger's NUMERIC(20, 4).
MAX_RATE = Decimal(10) ** 7
RATE_PLACES = 6
MAX_NUMBER = Decimal(10) ** 12  # purchase prices, in any currency's major unit
NUMBER_PLACES = 9
MAX_DEPRECIATION_MONTHS = Decimal(1200)
MAX_POWER_WATTS = Decimal(100_000)
MAX_PUE = Decimal(10)
MAX_BOOK_BYTES = 1 << 20

_GPU_KEYS = {
    "hourly_rate",
    "purchase_price",
    "depreciation_months",
    "power_watts",
    "electricity_price_per_kwh",
    "pue",
    "overhead_per_hour",
    "source",
}
_VERSION_KEYS = {
    "effective_from",
    "effective_to",
    "source",
    "slice_weight",
    "idle",
    "sharing_efficiency",
    "sharing_split",
    "utilization_tiers",
    "gpus",
}
_SEED_TOP = {
    "version",
    "gpuTypes",
    "utilizationTiers",
    "sharingEfficiency",
    "currency",
    "electricityPrice",
    "sliceWeight",
    "idle",
    "effectiveFrom",
    "sharingSplit",
}
_SEED_GPU = {"name", "hourlyCost", "purchasePrice", "powerConsumption", "depreciation"}
_SEED_SHARING = {"mig": "mig", "vgpu": "vgpu", "timeSharing": "time_slicing", "mps": "mps"}


def load_price_book(path: str | Path) -> PriceBook:
    """Load and validate a price book file (either layout)."""
    path = Path(path)
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_BOOK_BYTES + 1)  # a bounded read: the size is checked by load_yaml
    except OSError as exc:
        raise PriceBookError(path, "(file)", str(path), f"cannot read: {exc.strerror}") from None
    try:
        doc = load_yaml(raw, max_bytes=MAX_BOOK_BYTES)
    except YamlRefused as exc:
        raise PriceBookError(path, exc.field, exc.value, exc.problem) from None
    digest = hashlib.sha256(raw).hexdigest()
    if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
        doc = _unwrap_configmap(path, doc)
    if not isinstance(doc, dict):
        raise PriceBookError(path, "(document)", type(doc).__name__, "expected a mapping at the top level")
    if "gpuTypes" in doc:
        return _parse_seed(path, doc, digest)
    return _parse_native(path, doc, digest)


def _unwrap_configmap(path: Path, doc: dict) -> Any:
    data = doc.get("data")
    if not isinstance(data, dict) or not data:
        raise PriceBookError(path, "data", data, "ConfigMap without data")
    key = "cost-model.yaml" if "cost-model.yaml" in data else next(iter(data))
    if not isinstance(data[key], str):  # a ConfigMap's data values are strings (the file's text)
        raise PriceBookError(path, f"data.{key}", data[key], "expected the price book as a string (use |)")
    try:
        return load_yaml(data[key], max_bytes=MAX_BOOK_BYTES)
    except YamlRefused as exc:
        raise PriceBookError(path, f"data.{key}: {exc.field}", exc.value, exc.problem) from None


# --- field helpers -------------------------------------------------------------------------


def _dec(
    path,
    name: str,
    value: Any,
    *,
    positive: bool = False,
    at_most_one: bool = False,
    maximum: Decimal = MAX_NUMBER,
    places: int = NUMBER_PLACES,
) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise PriceBookError(path, name, value, "not a number")
    text = str(value).strip()
    if len(text) > 64:  # Decimal would parse a megabyte of digits; no price needs more than 20
        raise PriceBookError(path, name, f"{text[:20]}... ({len(text)} characters)", "not a number")
    try:
        number = Decimal(text)
    except InvalidOperation:
        raise PriceBookError(path, name, value, "not a number") from None
    if not number.is_finite():
        raise PriceBookError(path, name, value, "not a finite number")
    if number < 0 or number.is_signed():  # -0.0 too: a sign on a price is a typo, never meant
        raise PriceBookError(path, name, value, "negative")
    if positive and number == 0:
        raise PriceBookError(path, name, value, "must be greater than 0")
    if at_most_one and number > 1:
        raise PriceBookError(path, name, value, "must be between 0 and 1")
    if number > maximum:
        raise PriceBookError(path, name, value, f"larger than {maximum:,} (docs/billing.md §3.4)")
    exponent = number.normalize().as_tuple().exponent
    if isinstance(exponent, int) and -exponent > places:
        raise PriceBookError(path, name, value, f"more than {places} decimal places")
    return number


def _rate(path, name: str, value: Any, *, positive: bool = False) -> Decimal:
    return _dec(path, name, value, positive=positive, maximum=MAX_RATE, places=RATE_PLACES)


def _when(path, name: str, value: Any) -> datetime:
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, date):
        moment = datetime(value.year, value.month, value.day)
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise PriceBookError(path, name, value, "not an ISO 8601 date or time") from None
    else:
        raise PriceBookError(path, name, value, "not an ISO 8601 date or time")
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _mapping(path, name: str, value: Any, allowed: set[str] | None = None) -> dict:
    if not isinstance(value, dict):
        raise PriceBookError(path, name, value, "expected a mapping")
    if allowed is not None:
        for key in value:
            if key not in allowed:
                raise PriceBookError(path, f"{name}.{key}" if name else str(key), value[key], "unknown field")
    return value


def _currency(path, name: str, value: Any) -> str:
    if not isinstance(value, str) or value not in MINOR_UNITS:
        raise PriceBookError(path, name, value, "unknown currency (expected an ISO 4217 code such as USD)")
    return value


def _choice(path, name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise PriceBookError(path, name, value, f"expected one of {', '.join(choices)}")
    return value


def _tiers(path, name: str, value: Any) -> tuple[tuple[Decimal, Decimal, Decimal], ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not value:
        raise PriceBookError(path, name, value, "expected a non-empty list of {range, efficiency}")
    tiers = []
    for i, tier in enumerate(value):
        where = f"{name}[{i}]"
        tier = _mapping(path, where, tier, {"range", "efficiency"})
        bounds = tier.get("range")
        if not isinstance(bounds, list) or len(bounds) != 2:
            raise PriceBookError(path, f"{where}.range", bounds, "expected [low, high]")
        low = _dec(path, f"{where}.range[0]", bounds[0], at_most_one=True)
        high = _dec(path, f"{where}.range[1]", bounds[1], at_most_one=True)
        if high <= low:
            raise PriceBookError(path, f"{where}.range", bounds, "high must exceed low")
        expected_low = tiers[-1][1] if tiers else Decimal(0)
        if low != expected_low:
            raise PriceBookError(
                path, f"{where}.range[0]", bounds[0], f"tiers must be contiguous from {expected_low}"
            )
        eff = _dec(path, f"{where}.efficiency", tier.get("efficiency"), at_most_one=True)
        tiers.append((low, high, eff))
    if tiers[-1][1] != 1:
        raise PriceBookError(
            path, f"{name}[{len(tiers) - 1}].range[1]", str(tiers[-1][1]), "tiers must end at 1"
        )
    return tuple(tiers)


def _derive_rate(
    path, where: str, spec: dict, names: dict[str, str], electricity: Any = None
) -> GpuPrice | None:
    """Rate from TCO inputs; ``names`` maps our input names to the field names used in the file."""

    def get(key):
        return spec.get(names[key]) if key in names else None

    purchase, months = get("purchase_price"), get("depreciation_months")
    if purchase is None or months is None:
        return None
    purchase = _dec(path, f"{where}.{names['purchase_price']}", purchase)
    months = _dec(
        path,
        f"{where}.{names['depreciation_months']}",
        months,
        positive=True,
        maximum=MAX_DEPRECIATION_MONTHS,
    )
    rate = purchase / (months * HOURS_PER_MONTH)
    watts = get("power_watts")
    if watts is not None:
        watts = _dec(path, f"{where}.{names['power_watts']}", watts, maximum=MAX_POWER_WATTS)
        price_field = names.get("electricity_price_per_kwh", "electricityPrice")
        kwh = get("electricity_price_per_kwh") if electricity is None else electricity
        if kwh is None:
            raise PriceBookError(
                path, f"{where}.{price_field}", None, "missing: power draw needs an electricity price"
            )
        kwh = _dec(path, f"{where}.{price_field}", kwh)
        pue = get("pue")
        pue = Decimal(1) if pue is None else _dec(path, f"{where}.pue", pue, positive=True, maximum=MAX_PUE)
        rate += watts / 1000 * pue * kwh
    overhead = get("overhead_per_hour")
    if overhead is not None:
        rate += _rate(path, f"{where}.overhead_per_hour", overhead)
    rate = rate.quantize(RATE_QUANTUM, rounding=ROUND_HALF_EVEN)
    if rate > MAX_RATE:
        raise PriceBookError(
            path,
            f"{where}.{names['purchase_price']}",
            str(purchase),
            f"derives {rate} per hour, over {MAX_RATE:,}",
        )
    return GpuPrice(model="", hourly_rate=rate, derived=True)


_NATIVE_NAMES = {k: k for k in _GPU_KEYS}


def _native_gpu(path, where: str, model: str, spec: Any) -> GpuPrice:
    if not isinstance(spec, dict):
        spec = {"hourly_rate": spec}
    _mapping(path, where, spec, _GPU_KEYS)
    bounds = {"depreciation_months": MAX_DEPRECIATION_MONTHS, "power_watts": MAX_POWER_WATTS}
    for key in ("purchase_price", "depreciation_months", "power_watts", "electricity_price_per_kwh"):
        if key in spec:
            _dec(path, f"{where}.{key}", spec[key], maximum=bounds.get(key, MAX_NUMBER))
    if "overhead_per_hour" in spec:
        _rate(path, f"{where}.overhead_per_hour", spec["overhead_per_hour"])
    if spec.get("hourly_rate") is not None:
        return GpuPrice(model, _rate(path, f"{where}.hourly_rate", spec["hourly_rate"], positive=True))
    derived = _derive_rate(path, where, spec, _NATIVE_NAMES)
    if derived is None:
        raise PriceBookError(
            path,
            f"{where}.hourly_rate",
            None,
            "missing: give hourly_rate, or purchase_price + depreciation_months",
        )
    return GpuPrice(model, derived.hourly_rate, True)


def _check_overlaps(
    path, versions: list[PriceVersion], field_prefix: str = "versions"
) -> tuple[PriceVersion, ...]:
    ordered = sorted(versions, key=lambda v: v.effective_from)
    for i, version in enumerate(ordered):
        if version.effective_to is not None and version.effective_to <= version.effective_from:
            raise PriceBookError(
                path,
                f"{field_prefix}[{i}].effective_to",
                version.effective_to.isoformat(),
                "not after effective_from",
            )
        if i + 1 < len(ordered):
            nxt = ordered[i + 1]
            if nxt.effective_from == version.effective_from:
                raise PriceBookError(
                    path,
                    f"{field_prefix}[{i + 1}].effective_from",
                    nxt.effective_from.isoformat(),
                    "overlapping versions: two versions start at the same time",
                )
            if version.effective_to is not None and version.effective_to > nxt.effective_from:
                raise PriceBookError(
                    path,
                    f"{field_prefix}[{i}].effective_to",
                    version.effective_to.isoformat(),
                    "overlapping versions: runs past the next version's effective_from "
                    + nxt.effective_from.isoformat(),
                )
    # A version without effective_to runs until the next one starts.
    return tuple(
        replace(v, effective_to=ordered[i + 1].effective_from)
        if v.effective_to is None and i + 1 < len(ordered)
        else v
        for i, v in enumerate(ordered)
    )


def _sharing(path, name: str, value: Any, names: dict[str, str]) -> dict[str, Decimal]:
    if value is None:
        return {}
    value = _mapping(path, name, value, set(names))
    return {names[k]: _dec(path, f"{name}.{k}", v, at_most_one=True) for k, v in value.items()}


def _parse_native(path: Path, doc: dict, digest: str) -> PriceBook:
    _mapping(path, "", doc, {"currency", "aliases", "versions"})
    if "currency" not in doc:
        raise PriceBookError(path, "currency", None, "missing")
    currency = _currency(path, "currency", doc["currency"])
    aliases = doc.get("aliases") or {}
    _mapping(path, "aliases", aliases)
    seen_aliases: dict[str, str] = {}
    for alias, model in aliases.items():
        if not isinstance(alias, str) or not isinstance(model, str):
            raise PriceBookError(path, f"aliases.{alias}", model, "expected NVML name: model")
        if alias.upper() in seen_aliases:  # names are matched case-insensitively
            raise PriceBookError(
                path,
                f"aliases.{alias}",
                alias,
                f"duplicate alias (also written {seen_aliases[alias.upper()]!r})",
            )
        seen_aliases[alias.upper()] = alias
        _refuse_repointed_builtin(path, alias, model)
    raw_versions = doc.get("versions")
    if not isinstance(raw_versions, list) or not raw_versions:
        raise PriceBookError(path, "versions", raw_versions, "expected a non-empty list of versions")
    versions = []
    for i, raw in enumerate(raw_versions):
        where = f"versions[{i}]"
        raw = _mapping(path, where, raw, _VERSION_KEYS)
        if "effective_from" not in raw:
            raise PriceBookError(path, f"{where}.effective_from", None, "missing")
        gpus_raw = raw.get("gpus")
        if not isinstance(gpus_raw, dict) or not gpus_raw:
            raise PriceBookError(
                path, f"{where}.gpus", gpus_raw, "expected a non-empty mapping of GPU model to price"
            )
        for model in gpus_raw:  # YAML makes `~` None and `100` a number: neither names a model
            if not isinstance(model, str) or not model.strip():
                raise PriceBookError(path, f"{where}.gpus.{model}", model, "expected a GPU model name")
        gpus = {m: _native_gpu(path, f"{where}.gpus.{m}", m, s) for m, s in gpus_raw.items()}
        _refuse_case_duplicates(path, f"{where}.gpus", gpus)
        versions.append(
            PriceVersion(
                effective_from=_when(path, f"{where}.effective_from", raw["effective_from"]),
                effective_to=None
                if raw.get("effective_to") is None
                else _when(path, f"{where}.effective_to", raw["effective_to"]),
                gpus=gpus,
                source=str(raw.get("source", "")),
                slice_weight=_choice(
                    path, f"{where}.slice_weight", raw.get("slice_weight", "compute"), SLICE_WEIGHT_POLICIES
                ),
                idle=_choice(path, f"{where}.idle", raw.get("idle", "platform"), IDLE_POLICIES),
                sharing_efficiency=_sharing(
                    path,
                    f"{where}.sharing_efficiency",
                    raw.get("sharing_efficiency"),
                    {m: m for m in SHARING_MODES},
                ),
                utilization_tiers=_tiers(path, f"{where}.utilization_tiers", raw.get("utilization_tiers")),
                sharing_split=_choice(
                    path, f"{where}.sharing_split", raw.get("sharing_split", "equal"), SHARING_SPLITS
                ),
            )
        )
    models = {m.upper() for version in versions for m in version.gpus}
    for alias, model in aliases.items():
        if model.upper() not in models:
            raise PriceBookError(path, f"aliases.{alias}", model, "no version of this book prices that model")
    return PriceBook(currency, _check_overlaps(path, versions), dict(aliases), str(path), digest)


def _refuse_repointed_builtin(path, alias: str, model: str) -> None:
    """A built-in NVML name (billing/pricing/aliases.py) names one model whatever the book: a book
    re-pointing it prices one GPU as another (an H100 at a T4's rate). A book may name it to the
    same model, and add aliases of its own."""
    builtin = {name.upper(): target for name, target in NVML_ALIASES.items()}.get(alias.upper())
    if builtin is not None and builtin.upper() != model.upper():
        raise PriceBookError(
            path, f"aliases.{alias}", model, f"a built-in alias of {builtin}; it cannot be re-pointed"
        )


def _refuse_case_duplicates(path, where: str, gpus: dict[str, GpuPrice]) -> None:
    """Model keys are matched case-insensitively (billing/pricing/aliases.py): two spellings of one
    model would make the price depend on which one the lookup met first."""
    seen: dict[str, str] = {}
    for model in gpus:
        if model.upper() in seen:
            raise PriceBookError(
                path, f"{where}.{model}", model, f"duplicate model (also written {seen[model.upper()]!r})"
            )
        seen[model.upper()] = model


def _parse_seed(path: Path, doc: dict, digest: str) -> PriceBook:
    _mapping(path, "", doc, _SEED_TOP)
    currency = _currency(path, "currency", doc.get("currency", "USD"))
    gpu_types = doc["gpuTypes"]
    if not isinstance(gpu_types, list) or not gpu_types:
        raise PriceBookError(path, "gpuTypes", gpu_types, "expected a non-empty list")
    names = {
        "purchase_price": "purchasePrice",
        "depreciation_months": "depreciation",
        "power_watts": "powerConsumption",
    }
    gpus: dict[str, GpuPrice] = {}
    for i, spec in enumerate(gpu_types):
        where = f"gpuTypes[{i}]"
        spec = _mapping(path, where, spec, _SEED_GPU)
        name = spec.get("name")
        if not isinstance(name, str) or not name.strip():
            raise PriceBookError(path, f"{where}.name", name, "missing GPU type name")
        model = name.strip().upper()
        if model in gpus:
            raise PriceBookError(path, f"{where}.name", name, "duplicate GPU type")
        if "purchasePrice" in spec:
            _dec(path, f"{where}.purchasePrice", spec["purchasePrice"])
        if "powerConsumption" in spec:
            _dec(path, f"{where}.powerConsumption", spec["powerConsumption"], maximum=MAX_POWER_WATTS)
        if "depreciation" in spec:
            _dec(
                path,
                f"{where}.depreciation",
                spec["depreciation"],
                positive=True,
                maximum=MAX_DEPRECIATION_MONTHS,
            )
        if spec.get("hourlyCost") is not None:
            gpus[model] = GpuPrice(
                model, _rate(path, f"{where}.hourlyCost", spec["hourlyCost"], positive=True)
            )
            continue
        electricity = doc.get("electricityPrice")
        derived = _derive_rate(path, where, spec, names, electricity)
        if derived is None:
            raise PriceBookError(
                path, f"{where}.hourlyCost", None, "missing: give hourlyCost, or purchasePrice + depreciation"
            )
        gpus[model] = GpuPrice(model, derived.hourly_rate, True)
    version = PriceVersion(
        effective_from=EPOCH
        if doc.get("effectiveFrom") is None
        else _when(path, "effectiveFrom", doc["effectiveFrom"]),
        effective_to=None,
        gpus=gpus,
        source=f"seed-003 cost model {doc.get('version', '')}".strip(),
        slice_weight=_choice(path, "sliceWeight", doc.get("sliceWeight", "compute"), SLICE_WEIGHT_POLICIES),
        idle=_choice(path, "idle", doc.get("idle", "platform"), IDLE_POLICIES),
        sharing_efficiency=_sharing(path, "sharingEfficiency", doc.get("sharingEfficiency"), _SEED_SHARING),
        utilization_tiers=_tiers(path, "utilizationTiers", doc.get("utilizationTiers")),
        sharing_split=_choice(path, "sharingSplit", doc.get("sharingSplit", "equal"), SHARING_SPLITS),
    )
    return PriceBook(currency, (version,), {}, str(path), digest)
