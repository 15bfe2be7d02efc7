"""A fleet: data-parallel engine replicas on Ray behind one OpenAI front end (`samebits serve MODEL
--data-parallel-size N`, `LLM(model, data_parallel_size=N)`; docs/FLEET.md).

Every replica is a whole engine with the same numerics identity (fingerprint), so a request's bits do not depend on
which replica runs it: the router (`router.py`) is free to place it by load and prefix, a replica that fails has its
requests finished on another with the same bits (`engine.py`), and a weight update reaches every replica between
requests or none. `replica.py` is the Ray actor, `client.py` the front end's handle on one, `identity.py` the check
that admits a replica, `cluster.py` Ray's side, `llm.py` the offline API.
"""
