"""PublishedTensor: one entry of Subscriber.published_manifest() (and Publisher.manifest)."""

from __future__ import annotations


class PublishedTensor(tuple):
    """(name, dtype, shape) of one tensor: unpacks as that 3-tuple and compares equal to it.

    `alias_of` names the earlier tensor whose bytes these are when the publisher serves one tensor
    under two names (tied weights, e.g. an embedding that is also the output projection), else
    None. An engine that allocates its own buffers gives an alias its original's buffer
    (`Subscriber.allocate(name, dtype, shape, alias_of=...)`), so the bytes move once.
    """

    def __new__(cls, name: str, dtype: str, shape: tuple[int, ...],
                alias_of: str | None = None) -> PublishedTensor:
        self = super().__new__(cls, (name, dtype, shape))
        self.alias_of = alias_of
        return self

    @property
    def name(self) -> str:
        return self[0]

    @property
    def dtype(self) -> str:
        return self[1]

    @property
    def shape(self) -> tuple[int, ...]:
        return self[2]

    def __repr__(self) -> str:
        alias = f", alias_of={self.alias_of!r}" if self.alias_of is not None else ""
        return f"PublishedTensor({self[0]!r}, {self[1]!r}, {self[2]!r}{alias})"

    def __reduce__(self):
        return (PublishedTensor, (self[0], self[1], self[2], self.alias_of))
