"""Price sources: the price-book interface (`base`) and the YAML price books (`static`)."""

from billing.pricing.base import GpuPrice as GpuPrice
from billing.pricing.base import PriceBook as PriceBook
from billing.pricing.base import PriceBookError as PriceBookError
from billing.pricing.base import PriceSource as PriceSource
from billing.pricing.base import PriceVersion as PriceVersion
from billing.pricing.static import load_price_book as load_price_book
