"""The HiCache data-path harness: real sglang pools and transfer pieces on CPU, driven in the draft's logical slot
space (docs/hicache-datapath.md)."""
