"""Generated from `api.proto` beside this file (the kubelet's PodResources v1 API); never edited.

`reporter.collect.podresources` is the one reader of these modules; the command that regenerates
them is at the top of `api.proto`, and a test checks that they match it.
"""
