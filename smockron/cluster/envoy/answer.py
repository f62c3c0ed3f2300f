"""Pieces of an Envoy answer that need no servicer state: the reset in whole seconds
as upstream computes it, and upstream's dynamic metadata (``ratelimitToMetadata``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf import text_format
from google.protobuf.struct_pb2 import Struct

from smockron.cluster.envoy.pb import rls_pb2


def ceil_s(ms: int) -> int:
    """Whole seconds, rounded up, as upstream's ``CalculateReset`` (which counts from the
    current whole second) gives them."""
    return max(0, -(-ms // 1000))


def dynamic_metadata(
    request: rls_pb2.RateLimitRequest, passed: list[Mapping[str, Any] | None]
) -> Struct:
    """Upstream's ``ratelimitToMetadata``: the request, and the merged ``metadata`` of the
    limits that passed (the first one's value wins)."""
    descriptors = []
    for d in request.descriptors:
        item: dict[str, Any] = {"entries": [f"{e.key}={e.value}" for e in d.entries]}
        if d.HasField("limit"):
            item["limit"] = text_format.MessageToString(d.limit, as_one_line=True)
        if d.HasField("hits_addend"):
            item["hitsAddend"] = float(d.hits_addend.value)
        descriptors.append(item)
    fields: dict[str, Any] = {"domain": request.domain, "descriptors": descriptors}
    if request.hits_addend:
        fields["hitsAddend"] = float(request.hits_addend)
    merged: dict[str, Any] = {}
    for metadata in passed:
        if metadata:
            _merge(merged, metadata)
    if merged:
        fields["metadata"] = merged
    out = Struct()
    out.update(fields)
    return out


def _merge(dest: dict[str, Any], src: Mapping[str, Any]) -> None:
    for key, value in src.items():
        if key not in dest:
            dest[key] = _copy(value)
        elif isinstance(dest[key], dict) and isinstance(value, Mapping):
            _merge(dest[key], value)


def _copy(value: Any) -> Any:
    return {k: _copy(v) for k, v in value.items()} if isinstance(value, Mapping) else value
