"""``tidegate demo``: the whole loop (sidecars, scaler, KEDA/HPA and operator stand-ins, a bursty
multi-tenant load) on this machine, no cluster. See :mod:`tidegate.demo.run`."""
