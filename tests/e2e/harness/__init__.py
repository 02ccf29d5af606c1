"""The e2e harness: what runs tidegate's whole loop on the local control plane (no containers).

- :mod:`.launcher` installs the chart and runs the real operator and scaler as local processes;
- :mod:`.podagent` plays the kubelet: a real ``tidegate sim-backend`` + ``tidegate admission``
  pair per Ready pod, bound to the pod's (loopback) IP;
- :mod:`.keda` stands in for KEDA + the HPA (no KEDA controller runs here);
- :mod:`.load` is the client side (streamed chat completions, outcomes with reasons).
"""
