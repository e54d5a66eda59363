"""The billing ledger: interface (`base`) and the SQLAlchemy 2 implementation (`sqlalchemy`)."""

from gpumeter.billing.ledger.base import Ledger as Ledger
from gpumeter.billing.ledger.base import LockNotAcquired as LockNotAcquired
from gpumeter.billing.ledger.sqlalchemy import SqlLedger as SqlLedger
from gpumeter.billing.ledger.sqlalchemy import open_ledger as open_ledger
