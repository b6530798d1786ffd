"""The CRD validator that passes over subtrees it found clean before
(`crd_openapi._CleanSubtrees`) refuses exactly what validating every subtree refuses:
compared on generated RayClusters, each followed by a run of edits (valid and invalid:
wrong types, nulls, unknown and missing fields, duplicated list items, values out of
range, and edits undone), decoded as the API server decodes a write and not."""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests import factories
from tpu_autoscaler.controlplane import crd, crd_decode, crd_openapi
from tpu_autoscaler.controlplane.crd_errors import Invalid
from tpu_autoscaler.controlplane.crd_schema import schema

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**33), 2**33),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "x", "1", "2Gi", "4 chips", "2026-12-05T11:00:00Z", "IfNotPresent"]),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(["name", "image", "x", "replicas", "1"]), inner, max_size=3
        ),
    ),
    max_leaves=6,
)


def _edit(data: st.DataObject, obj: dict[str, Any], undo: list[dict[str, Any]]) -> dict[str, Any]:
    """`obj` with one edit somewhere under it (a copy)."""
    if undo and data.draw(st.integers(0, 4)) == 0:
        return copy.deepcopy(data.draw(st.sampled_from(undo)))
    edited = copy.deepcopy(obj)
    groups = edited["spec"].get("workerGroupSpecs")
    if isinstance(groups, list) and groups and data.draw(st.integers(0, 3)) == 0:
        # The autoscaler's own writes: pods named for deletion, now and then not a name.
        group = groups[data.draw(st.integers(0, len(groups) - 1))]
        if isinstance(group, dict):
            names = st.from_regex(r"c-g-worker-[a-z0-9]{5}", fullmatch=True)
            odd = st.sampled_from([None, 7, True, 1.5, ["x"], {"name": "x"}])
            weights = st.integers(0, 9)
            item = weights.flatmap(lambda w: odd if w == 0 else names)
            group["scaleStrategy"] = {"workersToDelete": data.draw(st.lists(item, max_size=12))}
            return edited
    # Under spec: the root's apiVersion, kind and metadata.name are checked before the
    # schema is (`crd.validate`), and the schema declares nothing else there.
    node: Any = edited["spec"]
    while True:
        keys: list[Any] = list(node) if isinstance(node, dict) else list(range(len(node)))
        containers = [k for k in keys if isinstance(node[k], dict | list) and node[k]]
        if not containers or data.draw(st.integers(0, 5)) == 0:
            break
        node = node[data.draw(st.sampled_from(containers))]
    keys = list(node) if isinstance(node, dict) else list(range(len(node)))
    how = data.draw(st.sampled_from(["set", "delete", "add", "duplicate", "retype"]))
    if how in ("set", "retype", "delete", "duplicate") and not keys:
        how = "add"
    if how == "set":
        node[data.draw(st.sampled_from(keys))] = data.draw(_VALUES)
    elif how == "retype":
        key = data.draw(st.sampled_from(keys))
        value = node[key]
        node[key] = [value] if not isinstance(value, list) else {"items": value}
    elif how == "delete":
        del node[data.draw(st.sampled_from(keys))]
    elif how == "duplicate":
        key = data.draw(st.sampled_from(keys))
        if isinstance(node, list):
            node.append(copy.deepcopy(node[key]))
        else:
            node[f"{key}x"] = copy.deepcopy(node[key])
    elif isinstance(node, dict):
        node[data.draw(st.sampled_from(["x", "name", "replicas", "groupName", "image"]))] = (
            data.draw(_VALUES)
        )
    else:
        node.append(data.draw(_VALUES))
    return edited


def _admitted(obj: dict[str, Any]) -> dict[str, Any] | str:
    try:
        return crd.admit(obj)
    except Invalid as exc:
        return str(exc)


@settings(max_examples=150, deadline=None)
@given(factories.valid_clusters(), st.data())
def test_remembering_clean_subtrees_refuses_what_whole_validation_refuses(
    cluster: dict[str, Any], data: st.DataObject
) -> None:
    root = schema("v1")
    versions = [crd_decode.decode(cluster).object]
    for _ in range(data.draw(st.integers(1, 8))):
        versions.append(_edit(data, versions[-1], versions))
    for version in versions:
        for obj in (version, crd_decode.decode(version).object):
            # errors_against validates every subtree; schema_errors passes over those
            # found clean in this run or any before.
            assert crd_openapi.schema_errors(obj, "v1") == crd_openapi.errors_against(obj, root)


def test_a_subtree_found_clean_once_is_validated_again_once_changed() -> None:
    """Seen red with the remembered subtrees keyed by their schema node alone."""
    group = factories.tpu_group("g", factories.ALL_SLICE_TYPES[0])
    cluster = factories.raycluster(group, name="c")
    assert not isinstance(_admitted(cluster), str)
    broken = copy.deepcopy(cluster)
    template = broken["spec"]["workerGroupSpecs"][0]["template"]
    template["spec"]["containers"][0]["image"] = 7
    message = _admitted(broken)
    assert isinstance(message, str)
    assert "template.spec.containers[0].image in body must be of type string" in message
    assert not isinstance(_admitted(cluster), str)


def test_a_mapping_of_another_dict_type_in_a_list_is_pruned_and_defaulted_as_a_dict() -> None:
    """The decode walks pass over the atoms of a list in C, and step into every dict
    and list among its items, of whatever dict or list type. Seen red with only exact
    dicts and lists stepped into."""
    group = factories.tpu_group("g", factories.ALL_SLICE_TYPES[0])
    cluster = factories.raycluster(group, name="c")
    container = cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    ordered = OrderedDict(container, unknownField=1)
    cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0] = ordered
    decoded = crd_decode.decode(cluster)
    assert (
        "unknownField"
        not in decoded.object["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    )
    assert decoded.unknown_fields == (
        "spec.workerGroupSpecs[0].template.spec.containers[0].unknownField",
    )
