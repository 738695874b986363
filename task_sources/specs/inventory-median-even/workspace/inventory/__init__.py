"""A tiny inventory toolkit: stock levels and simple statistics over them."""
