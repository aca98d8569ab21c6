package posixacl

import "testing"

func TestACLWithUser(t *testing.T) {
	// A named group masked to r-- stays r-- when uid 5 gets rwx.
	a := acl{{aclUserObj, 7, aclUndefinedID}, {aclGroupObj, 5, aclUndefinedID}, {aclGroup, 7, 9}, {aclMask, 4, aclUndefinedID}, {aclOther, 0, aclUndefinedID}}
	b, err := decodeACL(a.withUser(5, 7).encode())
	if err != nil {
		t.Fatal(err)
	}
	if !b.grants(5, 7) {
		t.Errorf("uid 5 not granted rwx: %+v", b)
	}
	for _, e := range b {
		if (e.tag == aclGroup || e.tag == aclGroupObj) && e.perm&^4 != 0 {
			t.Errorf("entry %+v widened beyond the old mask r--", e)
		}
	}
	// A minimal ACL's mask is the owning group's permissions plus uid's.
	m := aclFromMode(0o750).withUser(5, 1)
	for _, e := range m {
		if e.tag == aclMask && e.perm != 5 {
			t.Errorf("mask %o, want r-x", e.perm)
		}
	}
}
