"""Results on disk: the store (`_store`: results files, pieces, the one atomic writer)
and the CF conventions of what it writes (`_cf`). It imports only the schema."""
