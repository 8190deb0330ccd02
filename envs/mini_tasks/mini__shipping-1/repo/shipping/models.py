from dataclasses import dataclass


@dataclass(frozen=True)
class Item:
    name: str
    weight_g: int
    qty: int = 1

    def __post_init__(self):
        if self.weight_g <= 0 or self.qty <= 0:
            raise ValueError(f"{self.name}: weight and quantity must be positive")

    @property
    def total_g(self):
        return self.weight_g * self.qty
