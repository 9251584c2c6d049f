"""Block validation (docs/contract.md, "Block rules") and the dependency graph.

Every rule that needs the request's limits or the whole set of blocks lives here, so that an error
names the offending qualified ids (``source/id``) rather than a position in a JSON array.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from context_assembly.core.request import AssemblyOptions, Block
from context_assembly.errors import InvalidError

MAX_ID_CHARS = 256
MIN_PRIORITY, MAX_PRIORITY = -1000, 1000
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# RFC 3339 date-time with a mandatory offset: an expiry must be absolute, never local time.
_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$"
)


@dataclass(frozen=True, slots=True)
class SourceBlocks:
    """The blocks one source contributed, before validation."""

    source: str
    blocks: tuple[Block, ...]


@dataclass(slots=True)
class Node:
    """A validated block in the dependency graph."""

    qid: str
    source: str
    block: Block
    deps: tuple[str, ...]
    expires_at: datetime | None
    dependents: list[str] = field(default_factory=list)
    rank: tuple[int, str] = field(init=False)

    def __post_init__(self) -> None:
        # The published total order (priority descending, then qualified id), computed once.
        self.rank = (-self.block.priority, self.qid)


def qualified(source: str, block_id: str) -> str:
    """The qualified id ``source/id`` used in dependencies and the manifest."""
    return f"{source}/{block_id}"


def _invalid(detail: str, qids: Iterable[str], field_name: str | None = None) -> InvalidError:
    return InvalidError(detail, block_ids=sorted(set(qids)), field=field_name)


def parse_timestamp(value: str) -> datetime | None:
    """An RFC 3339 timestamp with an offset, or ``None`` when it is not one."""
    if not _RFC3339.match(value):
        return None
    try:
        return datetime.fromisoformat(value.replace("z", "Z").replace("t", "T"))
    except ValueError:
        return None


def _check_id(text: str, what: str, qid: str) -> None:
    if not text:
        raise _invalid(f"block {qid!r}: {what} must be nonempty", [qid], what)
    if len(text) > MAX_ID_CHARS:
        raise _invalid(
            f"block {qid!r}: {what} is longer than {MAX_ID_CHARS} characters", [qid], what
        )
    if _CONTROL.search(text):
        raise _invalid(f"block {qid!r}: {what} contains a control character", [qid], what)


# Fast paths: one regex match accepts the common, valid case; anything else goes through the
# detailed checks, which name the exact rule that failed.
_VALID_ID = re.compile(rf"[^\x00-\x1f\x7f-\x9f]{{1,{MAX_ID_CHARS}}}")
_VALID_DEP = re.compile(rf"[^/\x00-\x1f\x7f-\x9f]+/[^\x00-\x1f\x7f-\x9f]{{1,{MAX_ID_CHARS}}}")


def _check_block(source: str, block: Block, options: AssemblyOptions) -> Node:
    qid = source + "/" + block.id
    if not _VALID_ID.fullmatch(block.id):
        _check_id(block.id, "id", qid)
    limit = options.max_block_characters
    if len(block.text) > limit:
        raise _invalid(
            f"block {qid!r}: text has {len(block.text)} characters, over max_block_characters {limit}",
            [qid],
            "text",
        )
    if block.projection is not None and len(block.projection) > limit:
        raise _invalid(
            f"block {qid!r}: projection has {len(block.projection)} characters, "
            f"over max_block_characters {limit}",
            [qid],
            "projection",
        )
    if not MIN_PRIORITY <= block.priority <= MAX_PRIORITY:
        raise _invalid(
            f"block {qid!r}: priority {block.priority} is outside {MIN_PRIORITY}..{MAX_PRIORITY}",
            [qid],
            "priority",
        )
    deps: list[str] = []
    for dep in block.dependencies:
        if _VALID_DEP.fullmatch(dep) and dep != qid:
            if dep not in deps:
                deps.append(dep)
            continue
        dep_source, sep, dep_id = dep.partition("/")
        if not sep or not dep_source or not dep_id:
            raise _invalid(
                f"block {qid!r}: dependency {dep!r} is not a qualified 'source/id'",
                [qid],
                "dependencies",
            )
        _check_id(dep_id, "dependency id", qid)
        if dep == qid:
            raise _invalid(f"block {qid!r} depends on itself", [qid], "dependencies")
        if dep not in deps:
            deps.append(dep)
    expires_at: datetime | None = None
    if block.expires_at is not None:
        expires_at = parse_timestamp(block.expires_at)
        if expires_at is None:
            raise _invalid(
                f"block {qid!r}: expires_at must be an RFC 3339 timestamp with an offset",
                [qid],
                "expires_at",
            )
    return Node(
        qid, source, block, tuple(sorted(deps)) if len(deps) > 1 else tuple(deps), expires_at
    )


def check_source_blocks(source: str, blocks: Iterable[Block], options: AssemblyOptions) -> None:
    """The rules (docs/contract.md, "Block rules") that one source's blocks can break alone: each block's own rules,
    duplicate ids, more than ``max_blocks`` blocks, and a dependency cycle among them. What only
    several sources together break (the total over ``max_blocks``, a cycle through two sources)
    is ``build_graph``'s.

    Raises:
        InvalidError: naming the offending block(s), as ``build_graph`` would.
    """
    own: dict[str, Node] = {}
    for block in blocks:
        node = _check_block(source, block, options)
        if node.qid in own:
            raise _invalid(f"duplicate block id {node.qid!r}", [node.qid], "id")
        own[node.qid] = node
    if len(own) > options.max_blocks:
        raise InvalidError(
            f"{len(own)} blocks from source {source!r}, over max_blocks {options.max_blocks}",
            field="max_blocks",
            block_count=len(own),
        )
    _reject_cycles(own)


def build_graph(sources: Iterable[SourceBlocks], options: AssemblyOptions) -> dict[str, Node]:
    """Validate every block and return the graph keyed by qualified id.

    Raises:
        InvalidError: naming the offending block(s) for any rule of docs/contract.md, "Block rules": malformed ids,
            oversize text, priority out of range, unqualified dependencies, bad expiry, more than
            ``max_blocks`` blocks, duplicate qualified ids, or a dependency cycle.
    """
    all_sources = list(sources)
    total = sum(len(s.blocks) for s in all_sources)
    if total > options.max_blocks:
        raise InvalidError(
            f"{total} blocks in this preparation, over max_blocks {options.max_blocks}",
            field="max_blocks",
            block_count=total,
        )
    graph: dict[str, Node] = {}
    for item in all_sources:
        for block in item.blocks:
            node = _check_block(item.source, block, options)
            if node.qid in graph:
                raise _invalid(f"duplicate block id {node.qid!r}", [node.qid], "id")
            graph[node.qid] = node
    for node in graph.values():
        for dep in node.deps:
            target = graph.get(dep)
            if target is not None:
                target.dependents.append(node.qid)
    for node in graph.values():
        node.dependents.sort()
    _reject_cycles(graph)
    return graph


def _reject_cycles(graph: Mapping[str, Node]) -> None:
    """Iterative three-colour DFS; raises naming the ids on the first cycle found (sorted order)."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    for root in sorted(graph):
        if root in state:
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        path: list[str] = [root]
        state[root] = 1
        while stack:
            qid, index = stack[-1]
            deps = graph[qid].deps
            if index < len(deps):
                stack[-1] = (qid, index + 1)
                dep = deps[index]
                if dep not in graph:
                    continue
                mark = state.get(dep)
                if mark == 1:
                    cycle = path[path.index(dep) :]
                    raise _invalid(
                        "dependency cycle: " + " -> ".join([*cycle, dep]), cycle, "dependencies"
                    )
                if mark is None:
                    state[dep] = 1
                    stack.append((dep, 0))
                    path.append(dep)
            else:
                state[qid] = 2
                stack.pop()
                path.pop()
