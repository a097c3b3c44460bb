"""FedConcat's family: FedConcat (`fedconcat`), FedConcat-ID (`fedconcat_id`), stage 3's classifier
over the concatenated encoders (`classifier`) and stage 2 by a clustered algorithm (`table10`)."""

from __future__ import annotations

from fedray.records import Record

ENCODER, CLASSIFIER = "encoder", "classifier"  # the stages a FedConcat row records (stage 2, stage 3)


def staged(records: list[Record], stage: str) -> list[Record]:
    return [{**r, "stage": stage} for r in records]
