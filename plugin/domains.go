package plugin

import "strings"

// Domain identifies a control: what it does ("sandbox", "sites"), never who
// implements it. Consumers resolve controls by domain and never learn which
// plugin owns one, except through [Registry.Owner].
//
// A domain ID starts with a lower-case ASCII letter followed by ASCII letters
// and digits, at most 64 bytes ("sandbox", "sandboxArtifacts"). IDs are
// compared exactly; two IDs that differ only in case or separators are
// variants of one another, and the registry never lets a variant stand for a
// known domain (see [Registry.RegisterDomain]).
type Domain string

// Every domain corral knows. A domain becomes usable only when core declares
// it with [Registry.RegisterDomain], giving the interface its controls must
// implement.
const (
	// DomainSandbox is the sandbox control: the provider's preparation plus
	// core's RunCommand.
	DomainSandbox Domain = "sandbox"
	// DomainSites publishes a project's HTTP service through the daemon's
	// gateway.
	DomainSites Domain = "sites"
	// DomainLSP bridges a language server's raw session.
	DomainLSP Domain = "lsp"
	// DomainEditor serves the editor's Git reads.
	DomainEditor Domain = "editor"
	// DomainSandboxArtifacts reads and deletes artifacts inside a machine for
	// core's own use (GitHub export). It is core-only: provided with
	// [Registry.ProvideCore], resolved with [Registry.ResolveCore], and never
	// provided, consumed or resolved by a plugin under any spelling. The
	// registry treats it as core-only even before it is declared, and refuses
	// to declare it otherwise.
	DomainSandboxArtifacts Domain = "sandboxArtifacts"
)

// KnownDomains returns every domain ID above, in a fresh slice.
func KnownDomains() []Domain {
	return []Domain{DomainSandbox, DomainSites, DomainLSP, DomainEditor, DomainSandboxArtifacts}
}

// alwaysCoreOnly lists domains the registry treats as core-only whatever
// core declares.
func alwaysCoreOnly(key string) bool {
	return key == foldDomain(DomainSandboxArtifacts)
}

// validDomain reports whether d is a well-formed domain ID.
func validDomain(d Domain) bool {
	if len(d) == 0 || len(d) > 64 || d[0] < 'a' || d[0] > 'z' {
		return false
	}
	for i := 1; i < len(d); i++ {
		c := d[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}

// foldDomain maps d to the key under which variants collide: surrounding
// space trimmed, ASCII letters lower-cased, and every byte that is not an
// ASCII letter or digit dropped ("Sandbox_Artifacts " and "sandboxartifacts"
// fold alike). Non-ASCII bytes are dropped too, so a look-alike that merely
// adds invisible characters folds onto the domain it imitates.
func foldDomain(d Domain) string {
	s := strings.TrimSpace(string(d))
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9':
			b.WriteByte(c)
		case 'A' <= c && c <= 'Z':
			b.WriteByte(c + 'a' - 'A')
		}
	}
	return b.String()
}
