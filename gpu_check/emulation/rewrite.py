"""Rewrites CUDA C++ so that a host compiler builds it against the emulation
headers: the two constructs no header can express.

- A launch ``kernel<<<grid, block[, shared[, stream]]>>>(args)`` (the kernel
  may be qualified or a template-id, ``ns::Kernel<kCodec>``; configuration
  arguments may hold commas inside parentheses, ``GridFor(n)``) becomes

      ::cuda_emulation::Launch(::cuda_emulation::LaunchConfig(grid, block, ...),
                               [&](auto... cuda_emulation_args) {
                                 kernel(cuda_emulation_args...); }, args)

  (cuda_emulation/launch.h): the arguments are evaluated once, and each CUDA
  thread calls the kernel with its own copy; a kernel template's arguments
  are deduced per call as nvcc deduces them.
- A ``__shared__`` declaration ``__shared__ T a[N], b;`` becomes per-block
  storage, ``auto& a = ::cuda_emulation::BlockShared<T[N]>([] {});`` (one
  lambda type, hence one storage slot, per declaration; block.h), and
  ``extern __shared__ T d[];`` the launch's dynamic shared memory.

Comments, string and character literals are left alone. Line numbers are
kept (a construct spread over several lines is padded with line breaks), and
the rewritten file starts with a ``#line`` directive naming the original, so
compiler and sanitizer messages point into custom_ops/.
"""

import re

__all__ = ["RewriteError", "rewrite", "code_mask"]


class RewriteError(ValueError):
    """A launch or __shared__ declaration the rewrite cannot parse."""


_OPENERS = {"(": ")", "[": "]", "{": "}"}
_CLOSERS = {")": "(", "]": "[", "}": "{"}


def code_mask(text):
    """A list of booleans: True where text[i] is code (not a comment, string
    or character literal)."""
    mask = [True] * len(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not _word(text[i - 1])):
            delimiter = text[i + 2:text.find("(", i + 2)]
            end = text.find(")" + delimiter + '"', i)
            end = n if end < 0 else end + len(delimiter) + 2
        elif c in "\"'" and not (c == "'" and i > 0 and _word(text[i - 1])):  # 1'000 digit marks
            end = i + 1
            while end < n and text[end] != c and text[end] != "\n":
                end += 2 if text[end] == "\\" else 1
            end = min(end + 1, n)
        else:
            i += 1
            continue
        for j in range(i, end):
            mask[j] = False
        i = end
    return mask


def _word(c):
    return c.isalnum() or c == "_"


def _line_of(text, index):
    return text.count("\n", 0, index) + 1


def _find_code(text, mask, needle, start, end=None):
    end = len(text) if end is None else end
    i = text.find(needle, start, end)
    while i >= 0 and not all(mask[i:i + len(needle)]):
        i = text.find(needle, i + 1, end)
    return i


def _match_forward(text, mask, open_index, where):
    """Index of the bracket closing the one at open_index (()[]{})."""
    stack = [_OPENERS[text[open_index]]]
    i = open_index + 1
    while i < len(text):
        c = text[i]
        if mask[i]:
            if c in _OPENERS:
                stack.append(_OPENERS[c])
            elif c in _CLOSERS:
                if stack.pop() != c:
                    raise RewriteError("%s: unbalanced brackets" % where)
                if not stack:
                    return i
        i += 1
    raise RewriteError("%s: unclosed bracket" % where)


def _split_top_level(text, angle=False):
    """Splits at commas outside (), [], {} (and <> when angle is True)."""
    parts, depth, angles, start = [], 0, 0, 0
    mask = code_mask(text)
    for i, c in enumerate(text):
        if not mask[i]:
            continue
        if c in _OPENERS:
            depth += 1
        elif c in _CLOSERS:
            depth -= 1
        elif angle and depth == 0 and c == "<":
            angles += 1
        elif angle and depth == 0 and c == ">":
            angles -= 1
        elif c == "," and depth == 0 and angles == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _kernel_start(text, mask, launch, where):
    """Start of the kernel expression ending right before index `launch`:
    (qualified) names and template arguments, e.g. ``ns::Kernel<kCodec>``."""
    i = launch
    while i > 0 and text[i - 1].isspace():
        i -= 1
    while True:
        if i > 0 and text[i - 1] == ">" and mask[i - 1]:  # template arguments
            depth, j = 0, i - 1
            while j >= 0:
                if mask[j] and text[j] == ">":
                    depth += 1
                elif mask[j] and text[j] == "<":
                    depth -= 1
                    if depth == 0:
                        break
                j -= 1
            if j < 0:
                raise RewriteError("%s: unbalanced template arguments before <<<" % where)
            i = j
            while i > 0 and text[i - 1].isspace():
                i -= 1
        if i > 0 and text[i - 1] == ")" and mask[i - 1]:  # (kernel) or (*pointer)
            depth, j = 0, i - 1
            while j >= 0:
                if mask[j] and text[j] == ")":
                    depth += 1
                elif mask[j] and text[j] == "(":
                    depth -= 1
                    if depth == 0:
                        break
                j -= 1
            return j
        end = i
        while i > 0 and _word(text[i - 1]):
            i -= 1
        if i == end:
            raise RewriteError("%s: no kernel name before <<<" % where)
        j = i
        while j > 0 and text[j - 1].isspace():
            j -= 1
        if j >= 2 and text[j - 2:j] == "::":
            qualifier = j - 2
            i = qualifier
            while i > 0 and text[i - 1].isspace():
                i -= 1
            if i == 0 or not (_word(text[i - 1]) or text[i - 1] == ">"):
                return qualifier  # a leading :: (the global namespace)
            continue
        return i


def _pad(original, replacement):
    """replacement plus the line breaks that keep the following lines' numbers."""
    missing = original.count("\n") - replacement.count("\n")
    if missing <= 0:
        return replacement
    newline = "\\\n" if "\\\n" in original else "\n"  # inside a macro definition
    return replacement + newline * missing


def _rewrite_launches(text, name):
    out, position = [], 0
    mask = code_mask(text)
    while True:
        launch = _find_code(text, mask, "<<<", position)
        if launch < 0:
            break
        where = "%s:%d" % (name, _line_of(text, launch))
        start = _kernel_start(text, mask, launch, where)
        kernel = text[start:launch].strip()
        close = launch + 3
        depth = 0
        while close < len(text):
            c = text[close]
            if mask[close]:
                if c in _OPENERS:
                    depth += 1
                elif c in _CLOSERS:
                    depth -= 1
                elif depth == 0 and text.startswith(">>>", close):
                    break
            close += 1
        else:
            raise RewriteError("%s: <<< without >>>" % where)
        config = _split_top_level(text[launch + 3:close])
        if not 2 <= len(config) <= 4 or any(not part.strip() for part in config):
            raise RewriteError("%s: a launch takes 2 to 4 configuration arguments, not %r"
                               % (where, text[launch + 3:close]))
        paren = close + 3
        while paren < len(text) and text[paren].isspace():
            paren += 1
        if paren >= len(text) or text[paren] != "(":
            raise RewriteError("%s: no argument list after >>>" % where)
        end = _match_forward(text, mask, paren, where)
        arguments = text[paren + 1:end]
        call = ("::cuda_emulation::Launch(::cuda_emulation::LaunchConfig(%s), "
                "[&](auto... cuda_emulation_args) { %s(cuda_emulation_args...); }%s)"
                % (",".join(config), kernel, ", " + arguments if arguments.strip() else ""))
        out.append(text[position:start])
        out.append(_pad(text[start:end + 1], call))
        position = end + 1
    out.append(text[position:])
    return "".join(out)


_ALIGNMENT = re.compile(r"\b(?:alignas|__align__)\s*\(([^()]*)\)")
_FIRST_DECLARATOR = re.compile(
    r"^\s*(?P<type>.*?)(?<!\w)(?P<name>[A-Za-z_]\w*)\s*"
    r"(?P<dims>(?:\[[^\]]*\]\s*)*)$", re.S)
_NEXT_DECLARATOR = re.compile(
    r"^\s*(?P<pointer>[*&\s]*)(?P<name>[A-Za-z_]\w*)\s*(?P<dims>(?:\[[^\]]*\]\s*)*)$", re.S)


_SPECIFIER_WORDS = ("extern", "static", "volatile")


def _specifiers_start(text, mask, index):
    """Start of the specifiers right before `index` (extern, static, volatile,
    alignas(...), __align__(...)), or index itself."""
    start = i = index
    while True:
        while i > 0 and text[i - 1].isspace():
            i -= 1
        if i > 0 and text[i - 1] == ")" and mask[i - 1]:
            opening = text.rfind("(", 0, i - 1)
            word_end = opening
            while word_end > 0 and text[word_end - 1].isspace():
                word_end -= 1
            word_start = word_end
            while word_start > 0 and _word(text[word_start - 1]):
                word_start -= 1
            if text[word_start:word_end] not in ("alignas", "__align__"):
                return start
            start = i = word_start
            continue
        word_start = i
        while word_start > 0 and _word(text[word_start - 1]):
            word_start -= 1
        if word_start == i or text[word_start:i] not in _SPECIFIER_WORDS:
            return start
        start = i = word_start


def _rewrite_shared(text, name):
    out, position = [], 0
    mask = code_mask(text)
    while True:
        keyword = _find_code(text, mask, "__shared__", position)
        if keyword < 0:
            break
        if (keyword > 0 and _word(text[keyword - 1])) or _word(text[keyword + 10:keyword + 11]):
            position = keyword + 10
            continue
        where = "%s:%d" % (name, _line_of(text, keyword))
        start = _specifiers_start(text, mask, keyword)
        end = _find_code(text, mask, ";", keyword)
        if end < 0:
            raise RewriteError("%s: __shared__ declaration without ;" % where)
        prefix = text[start:keyword]
        body = text[keyword + 10:end]
        specifiers = prefix + " " + body
        extern = re.search(r"\bextern\b", specifiers) is not None
        volatile = "volatile " if re.search(r"\bvolatile\b", prefix) else ""
        alignments = [a.strip() for a in _ALIGNMENT.findall(specifiers)]
        body = _ALIGNMENT.sub(" ", body)
        body = re.sub(r"\b(?:extern|static)\b", " ", body)
        if "=" in body:
            raise RewriteError("%s: a __shared__ variable cannot have an initializer" % where)
        declarators = _split_top_level(body, angle=True)
        first = _FIRST_DECLARATOR.match(declarators[0])
        if first is None or not first.group("type").strip():
            raise RewriteError("%s: cannot parse the __shared__ declaration %r"
                               % (where, body.strip()))
        base_type = volatile + first.group("type").strip()
        statements = []
        for index, declarator in enumerate(declarators):
            match = first if index == 0 else _NEXT_DECLARATOR.match(declarator)
            if match is None:
                raise RewriteError("%s: cannot parse the declarator %r" % (where, declarator))
            if index == 0:
                var_type = base_type
            else:
                pointer = re.sub(r"\s+", "", match.group("pointer"))
                var_type = (base_type.rstrip("*& ") + " " + pointer).strip()
            dims = re.sub(r"\s+", "", match.group("dims"))
            variable = match.group("name")
            if extern:
                if dims != "[]":
                    raise RewriteError("%s: extern __shared__ %s must be an array of unknown "
                                       "size" % (where, variable))
                statements.append("%s* const %s = ::cuda_emulation::DynamicShared<%s>();"
                                  % (var_type, variable, var_type))
                continue
            if "[]" in dims:
                raise RewriteError("%s: __shared__ %s has no size" % (where, variable))
            alignment = ", " + alignments[0] if alignments else ""
            statements.append("auto& %s = ::cuda_emulation::BlockShared<%s%s%s>([] {});"
                              % (variable, var_type, dims, alignment))
        out.append(text[position:start])
        out.append(_pad(text[start:end + 1], " ".join(statements)))
        position = end + 1
    out.append(text[position:])
    return "".join(out)


def needs_rewrite(text):
    """Whether the text holds a launch or a __shared__ declaration (in code)."""
    mask = code_mask(text)
    return _find_code(text, mask, "<<<", 0) >= 0 or _find_code(text, mask, "__shared__", 0) >= 0


def rewrite(text, name="<source>", line_directive=None):
    """The rewritten source. name: for error messages; line_directive: a path
    to name in a leading #line directive (None: no directive)."""
    result = _rewrite_shared(_rewrite_launches(text, name), name)
    if line_directive is not None:
        path = str(line_directive).replace("\\", "\\\\").replace('"', '\\"')
        result = '#line 1 "%s"\n%s' % (path, result)
    return result
