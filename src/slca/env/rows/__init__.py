"""Row formats: one module per format (:mod:`.toucan`, :mod:`.verl`, :mod:`.paper`, :mod:`.slca`), each a
``from_<format>(row, index) -> Task`` builder over the shared field readers of :mod:`.fields`.
:func:`slca.env.loaders.task_from_row` picks the builder and names the source and row of an error."""
