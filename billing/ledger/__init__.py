"""The billing ledger: interface (`base`) and the SQLAlchemy 2 implementation (`sqlalchemy`)."""

from billing.ledger.base import Ledger as Ledger
from billing.ledger.base import LockNotAcquired as LockNotAcquired
from billing.ledger.sqlalchemy import SqlLedger as SqlLedger
from billing.ledger.sqlalchemy import open_ledger as open_ledger
