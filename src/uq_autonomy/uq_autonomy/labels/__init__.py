"""The label store and its tools (ROS-free): the SQLite store (:mod:`.store`), the fleet's
PostgreSQL store (:mod:`.postgres`) opened by URL (:mod:`.url`), the rules every stored field
is checked by (:mod:`.validation`), COCO export and import (:mod:`.coco`), the ``uq labels``
commands (:mod:`.cli`), the labelling web page (:mod:`.web`), and a private PostgreSQL server
for tests and benchmarks (:mod:`.postgres_server`)."""
