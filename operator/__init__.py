"""The tidegate operator: makes each InferencePool real, keeps it real, cleans up after it.

Pure core: ``builders`` (spec -> child manifests), ``warm_pool`` (which pods to promote or
drain), ``conditions`` (status from observed children). Thin shell: ``kube`` (server-side
apply, pod patches) and ``handlers`` (kopf). ``kopf run -m tidegate.operator.handlers`` or
``tidegate operator`` runs it.
"""
