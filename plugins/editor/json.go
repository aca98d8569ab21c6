package editorplugin

import "encoding/json"

// notRepoJSON is the whole JSON form of a result whose IsRepo is false.
var notRepoJSON = []byte(`{"isRepo":false}`)

// MarshalJSON encodes s; a status of a directory that is not a repository
// is exactly {"isRepo":false}.
func (s Status) MarshalJSON() ([]byte, error) {
	if !s.IsRepo {
		return notRepoJSON, nil
	}
	type plain Status
	if s.Entries == nil {
		s.Entries = []Entry{}
	}
	return json.Marshal(plain(s))
}

// MarshalJSON encodes l; a log of a directory that is not a repository is
// exactly {"isRepo":false}.
func (l Log) MarshalJSON() ([]byte, error) {
	if !l.IsRepo {
		return notRepoJSON, nil
	}
	type plain Log
	if l.Commits == nil {
		l.Commits = []Commit{}
	}
	return json.Marshal(plain(l))
}

// MarshalJSON encodes d; a diff of a directory that is not a repository is
// exactly {"isRepo":false}.
func (d Diff) MarshalJSON() ([]byte, error) {
	if !d.IsRepo {
		return notRepoJSON, nil
	}
	type plain Diff
	return json.Marshal(plain(d))
}

// MarshalJSON encodes f; a file of a directory that is not a repository is
// exactly {"isRepo":false}.
func (f File) MarshalJSON() ([]byte, error) {
	if !f.IsRepo {
		return notRepoJSON, nil
	}
	type plain File
	return json.Marshal(plain(f))
}
