//! Pure, embeddable request ranking: cluster snapshot and request profile in, ordered candidates with score breakdowns out.
