"""Prices: the price-book types (`base`) and the YAML price books that load into them (`static`)."""

from gpumeter.billing.pricing.base import GpuPrice as GpuPrice
from gpumeter.billing.pricing.base import PriceBook as PriceBook
from gpumeter.billing.pricing.base import PriceBookError as PriceBookError
from gpumeter.billing.pricing.base import PriceVersion as PriceVersion
from gpumeter.billing.pricing.static import load_price_book as load_price_book
