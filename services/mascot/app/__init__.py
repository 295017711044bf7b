"""The composition root: wires the components into runnable processes.

``stack`` starts an embedded stack (gateway, director, speaker, judge, reward model on loopback, one engine per base
model), ``model_runtime`` hosts several components on one engine, ``modelserver`` serves them as KServe models, and
``runjob`` runs the main job (dialogues over situation files) against a gateway. Nothing below this package
(components, ``mascot.core``, ``mascot.api``) imports it.
"""
