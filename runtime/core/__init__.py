"""The runtime core: :class:`Runtime`, the batch step (object and rows APIs), sequences and the
state machine each owns, requests, results, lifting a call's result, the registry of live slots,
the memory budget and speculation. Imports the loader, the host and the native layer below it;
never the engine above it."""
