"""Every sentence the CLI prints, in one catalogue, keyed by message id and language.

English is the default; ``--lang ko`` picks Korean (the card's language) where a translation
exists and falls back to English otherwise.
"""

from __future__ import annotations

LANGS = ("en", "ko")

CATALOGUE: dict[str, dict[str, str]] = {
    "demo.title": {
        "en": "reshard demo: {collective} as a layout exchange of A[{rows} x {cols}] ({dtype}) on {ranks} local ranks ({engine})",
        "ko": "reshard demo: A[{rows} x {cols}] ({dtype})를 {ranks}개 로컬 rank({engine})에서 {collective}로 layout 교환",
    },
    "demo.before": {"en": "Before: {placement}", "ko": "이전: {placement}"},
    "demo.after": {"en": "After: {placement} (redistribute used {collective})", "ko": "이후: {placement} (redistribute가 {collective} 사용)"},
    "demo.holds": {"en": "holds", "ko": "보유"},
    "demo.region": {"en": "region", "ko": "영역"},
    "demo.shape": {"en": "shape", "ko": "모양"},
    "demo.nothing": {"en": "nothing", "ko": "없음"},
    "demo.partial_sum": {"en": "partial sums of every block", "ko": "모든 블록의 부분합"},
    "demo.cut_rule": {
        "en": "Each rank cuts its block by destination and sends piece j to rank j:",
        "ko": "각 rank는 자기 블록을 목적지 기준으로 잘라 조각 j를 rank j에게 보낸다:",
    },
    "demo.stays": {"en": "(stays)", "ko": "(그대로)"},
    "demo.moved": {
        "en": "Moved: {sent} sent and {received} received per rank (own piece excluded); {summed}.",
        "ko": "이동: rank마다 {sent} 송신, {received} 수신 (자기 조각 제외); {summed}.",
    },
    "demo.not_summed": {"en": "no values were summed", "ko": "값을 더하지 않는다"},
    "demo.summed": {"en": "values were summed", "ko": "값을 더했다"},
    "demo.ok": {
        "en": "OK: all {ranks} ranks hold exactly their part of A under {placement} (checked against the full matrix, bit for bit).",
        "ko": "확인: {ranks}개 rank 모두 {placement}에서 자기 몫의 A를 정확히 보유 (전체 행렬과 비트 단위로 비교).",
    },
    "demo.bad": {
        "en": "WRONG: rank {rank} does not hold its part of A: {detail}",
        "ko": "오류: rank {rank}가 자기 몫의 A를 보유하지 않음: {detail}",
    },
    "demo.failed": {"en": "The demo failed: {error}", "ko": "demo 실패: {error}"},
    "placement.Shard(0)": {"en": "row-sharded (Shard(0))", "ko": "행(row) 분할 (Shard(0))"},
    "placement.Shard(1)": {"en": "column-sharded (Shard(1))", "ko": "열(column) 분할 (Shard(1))"},
    "placement.Replicate()": {"en": "replicated (Replicate())", "ko": "복제 (Replicate())"},
    "placement.Partial()": {"en": "partial sums (Partial())", "ko": "부분합 (Partial())"},
    "cli.error": {"en": "error: {error}", "ko": "오류: {error}"},
}


def say(key: str, lang: str = "en", **fields: object) -> str:
    """The message ``key`` in ``lang`` (English when there is no translation), filled in."""
    entry = CATALOGUE.get(key)
    if entry is None:
        raise KeyError(f"no message {key!r} in the catalogue")
    text = entry.get(lang) or entry["en"]
    return text.format(**fields)


def placement_words(placement: object, lang: str = "en") -> str:
    key = f"placement.{placement!r}"
    return say(key, lang) if key in CATALOGUE else repr(placement)
