from sqlalchemy import BigInteger, Boolean, Integer
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "fastapi_shop_orders"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    total: Mapped[int] = mapped_column(Integer)
    receipt_sent: Mapped[bool] = mapped_column(Boolean, default=False)
