"""K3BlockDrafter: a DSpark-style block drafter for the k3 engine (docs/block-drafter.md)."""
