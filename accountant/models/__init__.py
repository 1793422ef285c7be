"""Typed SQLAlchemy models; the schema itself is made only by the Alembic migrations."""

from __future__ import annotations

from accountant.models.admin_chain import AdminChain
from accountant.models.base import Base
from accountant.models.change_request import ChangeRequest
from accountant.models.charge_count import ChargeCount
from accountant.models.consumer import ApiKey, Consumer, Grant
from accountant.models.dashboard_session import DashboardSession
from accountant.models.dataset import Dataset, WindowBudget
from accountant.models.hold import Hold
from accountant.models.idempotency import IdempotencyKey
from accountant.models.key_hash_secret import KeyHashSecret
from accountant.models.ledger import LedgerEntry
from accountant.models.noise_secret import NoiseSecret
from accountant.models.partition import Partition
from accountant.models.population import Population
from accountant.models.signing_key import SigningKey
from accountant.models.tally import Tally, TallySpend

__all__ = [
    "AdminChain",
    "ApiKey",
    "Base",
    "ChangeRequest",
    "ChargeCount",
    "Consumer",
    "DashboardSession",
    "Dataset",
    "Grant",
    "Hold",
    "IdempotencyKey",
    "KeyHashSecret",
    "LedgerEntry",
    "NoiseSecret",
    "Partition",
    "Population",
    "SigningKey",
    "Tally",
    "TallySpend",
    "WindowBudget",
]
