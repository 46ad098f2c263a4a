#!/usr/bin/env bash
# Every function skv.h declares has its C++ wrapper in skv.hpp, named by the rule written at
# the top of skv.hpp: a call of the C function from inside the member (or free function) the
# rule names. skv.hpp's "// Unwrapped: skv_x  (reason)" lines list the deliberate exceptions.
# Then checks itself: a header with one more export must fail.
#   ctests/hpp_complete.sh [SKV_H [SKV_HPP]]   defaults: include/skv.h include/skv.hpp
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
header=${1:-$root/include/skv.h}
wrapper=${2:-$root/include/skv.hpp}

check() {
  perl - "$1" "$2" <<'PERL'
use strict;
use warnings;
my ($h, $hpp) = @ARGV;

# skv.h: the function declarations start in column 0; the first parameter is on that line.
my @fns;
open my $hf, '<', $h or die "$h: $!";
while (<$hf>) {
  next if /^(typedef|#|\s|\/|\*)/;
  push @fns, [$1, $2] if /^[A-Za-z].*?[ *](skv_[a-z0-9_]+)\(([^,)]*)/;
}
die "hpp_complete: no function declarations found in $h\n" unless @fns;

# skv.hpp without comments: which definition each skv_ call sits in. A definition is a line
# in column 0 (namespace scope) or column 2 (a class member) that names a function.
open my $wf, '<', $hpp or die "$hpp: $!";
my (%unwrapped, %classes, %calls);
my ($class, $def) = ('', '');
while (my $line = <$wf>) {
  $unwrapped{$1} = $2 if $line =~ m{^// Unwrapped: (skv_[a-z0-9_]+)\s+(\S.*)$};
  $line =~ s{//.*$}{};
  if ($line =~ /^(?:class|struct) (\w+)\b.*\{\s*$/) { ($class, $def) = ($1, ''); $classes{$1} = 1; next; }
  if ($line =~ /^\};/) { ($class, $def) = ('', ''); next; }
  my $indent = $class ? '  ' : '';
  if ($line =~ /^$indent(?!return\b)(?:[\w:<>,*&\[\]]+\s+)*[*&]?(~?\w+|operator[^(]*)\(/) {
    $def = "$class\::$1";
  }
  $calls{$1}{$def} = 1 while $line =~ /\b(skv_[a-z0-9_]+)\s*\(/g;
}

my ($wrapped, @bad) = (0);
my %declared = map { $_->[0] => 1 } @fns;
for my $u (sort keys %unwrapped) {
  push @bad, "$u is listed as unwrapped but skv.h declares no such function" unless $declared{$u};
}
for (@fns) {
  my ($f, $first) = @$_;
  next if exists $unwrapped{$f};
  (my $n = $f) =~ s/^skv_//;
  my $want;
  if ($n =~ /^([a-z]+)_new(?:_\w+)?$/ && $classes{ucfirst $1}) {
    $want = ucfirst($1) . '::' . ucfirst($1);
  } elsif ($n =~ /^([a-z]+)_free$/ && $classes{ucfirst $1}) {
    $want = ucfirst($1) . '::~' . ucfirst($1);
  } elsif ($first =~ /\bstruct skv_([a-z]+) \*\w/ && $classes{ucfirst $1}) {
    my $type = $1;
    (my $verb = $n) =~ s/^${type}_//;
    $want = ucfirst($type) . "::$verb";
  } else {
    $want = "::$n";
  }
  if (!$calls{$f}) {
    push @bad, "$f has no wrapper in skv.hpp (the naming rule wants $want)";
  } elsif (!$calls{$f}{$want}) {
    push @bad, "$f is called from " . join(', ', sort keys %{$calls{$f}}) . "; the naming rule wants $want";
  } else {
    $wrapped++;
  }
}
if (@bad) { print STDERR "hpp_complete: $_\n" for @bad; exit 1; }
printf "hpp_complete: %d functions in skv.h, %d wrapped by the naming rule, unwrapped: %s\n",
  scalar @fns, $wrapped, join(' ', sort keys %unwrapped) || 'none';
PERL
}

check "$header" "$wrapper"

# The check must notice a new export: skv.h plus one declaration has to fail.
probe=$(mktemp)
trap 'rm -f "$probe"' EXIT
sed 's/^const char \*skv_version(void);$/&\nenum skv_status skv_cache_probe_export(struct skv_cache *c);/' \
  "$header" >"$probe"
grep -q '^enum skv_status skv_cache_probe_export(' "$probe" ||
  { echo "hpp_complete: could not add a probe export to a copy of $header" >&2; exit 1; }
if check "$probe" "$wrapper" 2>/dev/null; then
  echo "hpp_complete: a header with one more export passed the check" >&2
  exit 1
fi
