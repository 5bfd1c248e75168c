"""The Kubernetes DRA CEL environment on top of the ``cel`` (cel-rust) package.

What the scheduler offers (``k8s.io/dynamic-resource-allocation/cel``) and how
it is provided here:

* ``device.driver``, ``device.attributes``, ``device.capacity``,
  ``device.allowMultipleAllocations`` -- a plain nested dict
  (:func:`device_activation`). The engine evaluates a selector on one device
  per group of devices that agree on what the selector reads
  (:mod:`dra_driver.allocator.cel.reads`, ``allocator/groups.py``).
* Unknown *domain* -> empty map, unknown *key* -> error.  cel-rust maps error
  on every unknown key and custom map types cannot be passed in, so the
  expression is rewritten: ``device.attributes[X]`` becomes
  ``(X in device.attributes ? device.attributes[X] : {})``.  ``X in
  device.attributes`` and ``has()`` keep their Kubernetes meaning (false for an
  unknown domain).
* Quantity and Semver objects: cel-rust cannot carry Python objects, so they
  are represented as one-key maps (``{"kubernetes.Quantity": "<exact value>"}``)
  whose value is canonical, which makes ``==`` value equality.  Methods such
  as ``q.compareTo(r)`` work because cel-rust turns ``x.f(a)`` into ``f(x, a)``
  for registered functions; the Python implementations dispatch on the marker.
* Optional syntax ``a.?b`` / ``m[?k]`` (unsupported by the cel-rust parser) and
  ``cel.bind()`` are rewritten into native constructs
  (``has(a.b) ? optional.of(a.b) : optional.none()``, ``[init].map(v, e)[0]``).
* Undeclared variables/functions and obviously non-bool results are rejected
  at compile time like the Kubernetes type checker would; other type errors
  surface at runtime (cel-rust has no checker).
* Cost: cel-rust has no cost tracking.  Every expression gets a static
  worst-case estimate (comprehension nesting x bounded list sizes); above
  :data:`MAX_COST` it is a compile error.  As a backstop each evaluation is
  timed and an expression that exceeds :data:`RUNTIME_LIMIT_S` twice in a row
  (a garbage collection can stall one run) is poisoned: that and all later
  evaluations fail with a cost error.

The ``cel`` package is imported without its command-line tool (:mod:`.package`).

Not supported (compile error): two-variable comprehensions, message/struct
literals, ``format``, IP/CIDR/URL libraries, DRA ``includes()`` (1.36 gate).
"""
