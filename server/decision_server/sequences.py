"""Token sequences compared in C: the host work of a batch of hundreds of reads over 512-token states must not take a
Python step per token (issue 42: on a GPU, all host work of a read fits in 0.5 ms)."""

from __future__ import annotations


def common_prefix(a: tuple[int, ...], b: tuple[int, ...], guess: int = 0) -> int:
    """The length of the longest common prefix of `a` and `b`, by slice comparisons (each one pass in C) where a
    loop over the tokens would be one Python step each: `guess` checked first, else a binary search."""
    high = min(len(a), len(b))
    if 0 < guess <= high and a[:guess] == b[:guess] and (guess == high or a[guess] != b[guess]):
        return guess
    if a[:high] == b[:high]:
        return high
    low, high = 0, high - 1  # a[:low] == b[:low] and a[:high + 1] != b[:high + 1] from here on
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low
