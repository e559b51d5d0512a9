#!/usr/bin/env bash
# libmlxdist.so must export exactly the functions the public headers declare: nothing private
# (mlxd_*, helpers, data), and every public declaration (one missing MLXDIST_API is a symbol a
# program cannot link). With a plugin, also: it exports only its entry point(s) and needs no
# symbol of libmlxdist (the host table gives it what it uses).
#   usage: check_exports.sh CC INCLUDE_DIR LIBMLXDIST [PLUGIN]
set -euo pipefail
cc=$1
inc=$2
lib=$3
plugin=${4:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The functions the headers declare, as this compiler sees them (conditional declarations such as
# the bfloat16 accessors follow the compiler's types, like the library's own build). The export
# macro is defined empty so a declaration that lacks it is found all the same.
"$cc" -std=c99 -E -DMLXDIST_API= -I"$inc" "$inc/mlx/c/mlx.h" > "$work/pp.c"
perl -e '
  my ($text, $keep) = ("", 0);
  while (my $l = <STDIN>) {
    if ($l =~ /^# \d+ "([^"]*)"/) { $keep = index($1, "/mlx/c/") >= 0; next; }
    $text .= $l if $keep;
  }
  $text =~ s/__attribute__\s*(\((?:[^()]++|(?1))*\))//g;  # format(printf...) and the like
  1 while $text =~ s/\{[^{}]*\}//g;                      # struct and enum bodies
  for my $decl (split /;/, $text) {
    next if $decl =~ /^\s*typedef\b/;
    print "$1\n" if $decl =~ /^[^(]*?\b(\w+)\s*\(/;    # the name before the first "("
  }' < "$work/pp.c" | sort -u > "$work/declared"

nm -D --defined-only "$lib" | awk "{print \$NF}" | sort -u > "$work/exported"

fail=0
n_decl=$(wc -l < "$work/declared")
if [ "$n_decl" -lt 50 ]; then
  echo "FAIL: only $n_decl function declarations found in $inc/mlx/c (the header parse is broken)"
  fail=1
fi
extra=$(comm -13 "$work/declared" "$work/exported")
missing=$(comm -23 "$work/declared" "$work/exported")
if [ -n "$extra" ]; then
  echo "FAIL: $lib exports symbols no public header declares (build with hidden visibility;"
  echo "      mark public functions MLXDIST_API):"
  echo "$extra" | sed 's/^/  /'
  fail=1
fi
if [ -n "$missing" ]; then
  echo "FAIL: public functions declared in $inc/mlx/c but not exported by $lib (missing MLXDIST_API"
  echo "      on the declaration, or not defined):"
  echo "$missing" | sed 's/^/  /'
  fail=1
fi

if [ -n "$plugin" ]; then
  bad=$(nm -D --defined-only "$plugin" | awk "{print \$NF}" | grep -v '^mlxdist_plugin' || true)
  if [ -n "$bad" ]; then
    echo "FAIL: $plugin exports more than its entry point:"
    echo "$bad" | sed 's/^/  /'
    fail=1
  fi
  bad=$(nm -D --undefined-only "$plugin" | awk "{print \$NF}" | grep -E '^_?mlxd?_' || true)
  if [ -n "$bad" ]; then
    echo "FAIL: $plugin needs libmlxdist symbols (it must use the host table):"
    echo "$bad" | sed 's/^/  /'
    fail=1
  fi
fi

[ "$fail" = 0 ] || exit 1
echo "exports: $lib exports exactly the $n_decl functions of the public headers${plugin:+; the plugin is self-contained}"
