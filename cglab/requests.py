"""Request bookkeeping (a much-reduced vLLM KV-cache manager): each request's blocks and stored tokens."""

from __future__ import annotations

from dataclasses import dataclass, field

from cglab.errors import CapacityError


class BlockPool:
    """Hands out block ids from a free list, lowest first (so runs are reproducible)."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise CapacityError(
                f"the paged caches are full: {n} more block(s) needed, {len(self._free)} free of {self.num_blocks}; "
                "raise ToyConfig.num_blocks or free finished requests with free_request()"
            )
        return [self._free.pop() for _ in range(n)]

    def free(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))


@dataclass
class RequestState:
    req_id: str
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    num_prompt_tokens: int | None = None  # None: the first step carries the whole prompt

    def is_prefilling(self) -> bool:
        """Whether this request's next step still carries prompt tokens."""
        if self.num_prompt_tokens is None:
            return self.num_computed_tokens == 0
        return self.num_computed_tokens < self.num_prompt_tokens

    def slot(self, position: int, block_size: int) -> int:
        """The cache slot of the token at ``position``: its block, then its offset in the block."""
        return self.block_ids[position // block_size] * block_size + position % block_size
