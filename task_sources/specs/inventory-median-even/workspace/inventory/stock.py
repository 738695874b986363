"""Stock levels and the reorder rule."""

from __future__ import annotations

from dataclasses import dataclass

from inventory.stats import median


@dataclass
class Item:
    sku: str
    on_hand: int
    daily_sales: list[int]

    def typical_daily_sales(self) -> float:
        return median(self.daily_sales) if self.daily_sales else 0.0

    def reorder_needed(self, lead_time_days: int) -> bool:
        return self.on_hand < self.typical_daily_sales() * lead_time_days
